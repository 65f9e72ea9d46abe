"""benchmarks/gpu_check.sh, fit for the first GPU lent: its time budget, its steps under
timeouts, the stop when compile cannot work, the PEP 668 fallback, its table, and the dry
run on this CPU."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def test_the_header_budget_fits_eight_minutes_and_every_step_runs_under_a_timeout():
    text = SCRIPT.read_text()
    rows = re.findall(r"^#   (\w[\w ]*?)\s+(\d+) s\s+(\d+) s", text, flags=re.M)
    steps = {name.strip(): (int(estimate), int(cap)) for name, estimate, cap in rows}
    assert set(steps) == {"dependencies", "doctor", "strong bench", "search", "verify", "table"}
    total = int(re.search(r"^#   total\s+(\d+) s", text, flags=re.M).group(1))
    assert total == sum(estimate for estimate, _ in steps.values()) <= 8 * 60
    assert "BUDGET_S=480" in text
    # Every autotune command runs through run_step (timeout, capped by the deadline) ...
    commands = [line for line in text.splitlines() if '"${AT[@]}" ' in line and not line.lstrip().startswith("#")]
    assert commands and all("run_step " in line for line in commands), commands
    caps = {name: int(cap) for name, cap in re.findall(r"run_step (\w+) (\d+) ", text)}
    assert caps == {"doctor": 60, "strong": 130, "search": 280, "verify": 75}
    assert caps["strong"] == steps["strong bench"][1] and caps["search"] == steps["search"][1]
    # ... and pip and the table under their own timeouts.
    assert text.count('timeout 90 "${PIP[@]}"') == 2 and 'timeout 30 "$PY" benchmarks/gpu_table.py' in text


def test_the_strong_row_on_a_gpu_is_the_strongest_combination_the_space_expresses():
    """Issue 3/6: the first GPU run shows packed batches, the whole model compiled with its
    loss, the chunked loss, bf16 and flash attention in one row (the dry run cannot: CPU)."""
    gpu_branch = SCRIPT.read_text().split("MODEL=gpt2; DEVICE=cuda:0", 1)[1].split("\nfi\n", 1)[0]
    strong = re.search(r"STRONG=\((.*?)\)", gpu_branch, flags=re.S).group(1).split()
    knobs = dict(arg.split("=", 1) for arg in strong if "=" in arg)
    assert "--batching" in strong and strong[strong.index("--batching") + 1] == "packed"
    assert {k: knobs[k] for k in ("amp_dtype", "compile_mode", "compile_scope", "loss_impl", "sdpa_backend")} == {
        "amp_dtype": "bfloat16",
        "compile_mode": "default",
        "compile_scope": "model",
        "loss_impl": "chunked",
        "sdpa_backend": "flash",
    }


FAKE_PYTHON = """#!/usr/bin/env bash
# A GPU machine's python, as far as gpu_check.sh can tell: dependencies missing, a system Python
# that refuses installs (PEP 668), and a doctor that finds an H200 but no C compiler.
if [ "$1" = "-c" ] && [[ "$2" == *"import optuna"* ]]; then
  [[ "${PYTHONPATH:-}" == *pydeps* ]] && exit 0 || exit 1
fi
if [ "$1 $2 $3" = "-m pip install" ]; then
  echo "pip $*" >> "$FAKE_LOG"
  [[ "$*" == *--target* ]] && exit 0
  echo "error: externally-managed-environment" >&2
  exit 1
fi
if [ "$1 $2 $3" = "-m autotune doctor" ]; then
  echo '{"device": {"kind": "cuda", "name": "NVIDIA H200"},'
  echo ' "compile": {"ok": false, "detail": "no C compiler (gcc, cc or clang, or $CC): install one (apt install gcc)"}}'
  exit 1
fi
if [ "$1" = "-" ]; then exec "$REAL_PYTHON" "$@"; fi
echo "unexpected: $*" >> "$FAKE_LOG"
exit 99
"""


@pytest.mark.process
def test_a_gpu_where_compile_cannot_work_stops_after_the_doctor_and_pep668_installs_to_a_target(tmp_path):
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    out, log = tmp_path / "out", tmp_path / "calls.log"
    env = {
        **os.environ,
        "PYTHON": str(python),
        "REAL_PYTHON": sys.executable,
        "FAKE_LOG": str(log),
        "OUT": str(out),
        "AUTOTUNE_WHEELS": str(wheels),
    }
    proc = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        "GPU CHECK on NVIDIA H200; results in " + str(out),
        "STOPPED: torch.compile cannot work on this machine: no C compiler (gcc, cc or clang, or $CC): install one "
        "(apt install gcc)",
        "every compiled trial would crash; fix it (autotune doctor says what is missing) and run again",
    ]
    calls = log.read_text().splitlines()
    assert len(calls) == 2 and "--target" not in calls[0]
    assert f"--no-index --find-links {wheels}" in calls[1] and f"--target {out}/pydeps" in calls[1]


def write_study(path: Path, references: dict[str, dict]) -> None:
    import optuna

    study = optuna.create_study(study_name="gpucheck", storage=f"sqlite:///{path}", direction="maximize")
    for name, m in references.items():
        study.add_trial(
            optuna.trial.create_trial(value=m["tokens_per_sec"], user_attrs={"reference": name, "measurement": m})
        )


def measurement(tps: float, **fields) -> dict:
    return {
        "tokens_per_sec": tps,
        "outcome": "ok",
        "device": {"name": "NVIDIA H200"},
        "config": {"amp_dtype": "bfloat16"},
        "mfu": 0.4,
        "mfu_at_context": 0.5,
        "peak_memory_bytes": 2**30,
        "peak_memory_source": "nvml-device",
        "padding_fraction": 0.1,
        "compile_time_s": 42.0,
        "recompiles_during_timing": 0,
        "unstable": False,
        **fields,
    }


def test_the_table_has_every_column_for_every_run(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_table

    write_study(
        tmp_path / "gpucheck.db",
        {
            "baseline": measurement(
                10_000.0,
                config={"amp_dtype": "float32"},
                mfu=0.02,
                mfu_at_context=0.02,
                peak_memory_source="nvml-process",
                padding_fraction=0.6,
                compile_time_s=0.0,
            ),
            "checklist": measurement(100_000.0, unstable=True),
        },
    )
    (tmp_path / "strong.json").write_text(json.dumps(measurement(300_000.0)))
    (tmp_path / "search.json").write_text(
        json.dumps(
            {
                "best": {"number": 5, "config": {"amp_dtype": "bfloat16"}, "measurement": measurement(400_000.0)},
                "n_trials": 6,
                "counts": {"ok": 6},
                "speedup_vs_baseline": 40.0,
                "speedup_vs_checklist": 4.0,
            }
        )
    )
    assert gpu_table.main(str(tmp_path), "0") == 0
    lines = capsys.readouterr().out.splitlines()
    table = [line.split(" | ") for line in lines if line.startswith("| ")]
    header = [cell.strip("| ") for cell in table[0]]
    assert header == gpu_table.HEADERS
    rows = {row[0].strip("| "): [cell.strip("| ") for cell in row] for row in table[1:]}
    base = rows["baseline (fp32 eager math, fixed 8x seq)"]
    best = rows["search best (trial 5)"]
    assert best[1:4] == ["400,000", "40.00x", "4.00x"]
    assert best[4:8] == ["40.0%", f"{0.4 * 989 / 790:.1%}", "50.0%", f"{0.5 * 989 / 790:.1%}"]
    assert best[8:] == ["1024 MiB", "nvml-device", "10.0%", "42.0", "0", "no", "ok"]
    assert base[5] == f"{0.02 * 66.9 / 790:.1%}"  # a float32 run's MFU against 790 uses the fp32 datasheet peak
    assert base[9] == "nvml-process" and base[10] == "60.0%"
    assert rows["checklist (bf16 compile flash, pinned, 4 workers)"][13] == "UNSTABLE"
    assert rows["verify of the search recipe"][-1] == "missing"
    assert json.loads((tmp_path / "baseline.json").read_text())["tokens_per_sec"] == 10_000.0


@pytest.mark.process
@pytest.mark.compile  # the doctor's check compiles for real
def test_the_dry_run_without_the_confirmation_run(gpu_check_run):
    proc, tmp_path = gpu_check_run  # run in the background from the session's start (conftest)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("DRY RUN")
    assert "--- verify: skipped (--skip-confirm)" in proc.stderr and not (tmp_path / "verify.json").exists()
    assert "| run | eff. tokens/s | x baseline | x checklist | MFU mean len (datasheet) |" in proc.stdout
    steps = [line.split("\t") for line in (tmp_path / "steps.tsv").read_text().splitlines()]
    assert [s[0] for s in steps] == ["doctor", "strong", "search"] and all(s[1] == "0" for s in steps), steps
    assert json.loads((tmp_path / "baseline.json").read_text())["outcome"] == "ok"
    doctor = json.loads((tmp_path / "doctor.json").read_text())
    # `autotune doctor` on this CPU, in a fresh process: torch.compile works here, for real.
    assert doctor["device"]["kind"] == "cpu" and doctor["compile"]["ok"] is True, doctor["compile"]
