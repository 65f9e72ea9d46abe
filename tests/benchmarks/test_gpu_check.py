"""benchmarks/gpu_check.sh, fit for the first GPU lent: its time budget, its steps under
timeouts, the offline install from the wheelhouse, python3 where there is no python, the stop when
compile cannot work, its table and probes, at most six files back, and the dry run on this CPU."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
# The wheelhouse of this machine's Python that .ci/run builds (python benchmarks/gpu_wheelhouse.py
# --python-version 3.11 --out .wheelhouse-cp311): the dry run installs from it, as the GPU machine does.
WHEELHOUSE = ROOT / f".wheelhouse-cp{sys.version_info.major}{sys.version_info.minor}"


def test_the_header_budget_fits_five_minutes_and_every_step_runs_under_a_timeout():
    text = SCRIPT.read_text()
    rows = re.findall(r"^#   (\w[\w ]*?)\s+(\d+) s\s+(\d+) s", text, flags=re.M)
    steps = {name.strip(): (int(estimate), int(cap)) for name, estimate, cap in rows}
    assert set(steps) == {"dependencies", "doctor", "probes", "generate", "llama", "search", "table"}
    total = int(re.search(r"^#   total\s+(\d+) s", text, flags=re.M).group(1))
    assert total == sum(estimate for estimate, _ in steps.values()) <= 360
    assert "BUDGET_S=360" in text
    # Every autotune command and the probes run through run_step (timeout, capped by the deadline) ...
    commands = [
        line
        for line in text.splitlines()
        if ('"${AT[@]}" ' in line or "gpu_probes.py" in line) and not line.lstrip().startswith("#")
    ]
    assert commands and all("run_step " in line for line in commands), commands
    caps = dict(re.findall(r"^[^#]*run_step (\w+) (\S+) ", text, flags=re.M))
    assert caps == {
        "doctor": "60",
        "probes": '"$PROBE_CAP"',
        "generate": "60",
        "llama": '"$LLAMA_CAP"',
        "search": '"$SEARCH_CAP"',
    }
    assert re.findall(r"PROBE_CAP=(\d+)", text) == ["120", "45"]  # the dry run's, the GPU's
    assert re.findall(r"LLAMA_CAP=(\d+)", text) == ["120", "45"]
    # The GPU compiles the Llama's checkpointed blocks (issue G's case); the dry run leaves that to
    # tests/knobs/test_checkpoint_compile.py, as it leaves the checklist's compile to the searches.
    assert re.findall(r"LLAMA_COMPILE=(\w+)", text) == ["none", "default"]
    assert steps["probes"][1] == 45 and steps["llama"][1] == 45
    # The search's cap is the header's, and no trial it starts outlives it: its --timeout is what
    # the step has left, less a trial's time and a process start.
    assert f"SEARCH_CAP=$(step_limit {steps['search'][1]})" in text
    assert "SEARCH_TIMEOUT=$(( SEARCH_CAP - TRIAL_TIMEOUT - 15 ))" in text
    # ... and pip and the table under their own timeouts.
    # (pip in gpu_deps.sh, which gpu_check.sh and gpu_ranks_check.sh both source)
    deps = (SCRIPT.parent / "gpu_deps.sh").read_text()
    assert 'source "$ROOT/benchmarks/gpu_deps.sh"' in text and 'timeout 30 "$py" -m pip install' in deps
    assert 'timeout 20 "$PY" benchmarks/gpu_table.py' in text


FAKE_PYTHON = """#!/usr/bin/env bash
# A GPU machine's python, as far as gpu_check.sh can tell: optuna & co. missing until pip installs
# them into --target, and a doctor that finds an H200 but no C compiler.
if [ "$1" = "-c" ] && [[ "$2" == *"import optuna"* ]]; then
  for dir in ${PYTHONPATH//:/ }; do [ -e "$dir/optuna" ] && exit 0; done
  exit 1
fi
if [ "$1 $2 $3" = "-m pip install" ]; then
  echo "pip $*" >> "$FAKE_LOG"
  target=$(echo "$*" | sed -E 's/.*--target ([^ ]+).*/\\1/')
  mkdir -p "$target/optuna"
  exit 0
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
def test_a_gpu_where_compile_cannot_work_stops_after_the_doctor_having_installed_offline(tmp_path):
    python = tmp_path / "python3"
    python.write_text(FAKE_PYTHON)
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "optuna-5.0.0-py3-none-any.whl").write_bytes(b"")
    out, log = tmp_path / "out", tmp_path / "calls.log"
    env = {
        **os.environ,
        "PYTHON": str(python),
        "REAL_PYTHON": sys.executable,
        "FAKE_LOG": str(log),
        "OUT": str(out),
        "AUTOTUNE_WHEELS": str(wheels),
    }
    env.pop("AUTOTUNE_GPU_CHECK_INSTALL", None)
    proc = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:3] == [
        "GPU CHECK on NVIDIA H200; files in " + str(out),
        "STOPPED: torch.compile cannot work on this machine: no C compiler (gcc, cc or clang, or $CC): install one "
        "(apt install gcc)",
        "every compiled trial would crash; fix it (autotune doctor says what is missing) and run again",
    ]
    assert lines[3].startswith("wall time: ") and sorted(p.name for p in out.iterdir()) == ["gpu_check.tar.gz"]
    calls = log.read_text().splitlines()
    assert len(calls) == 1, calls  # offline, without dependencies, into a target: no PEP 668 refusal
    assert "--no-index --no-deps" in calls[0] and "--target " in calls[0] and str(wheels) in calls[0]


def test_python3_is_taken_where_there_is_no_python(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "mktemp", "mkdir", "rm"):
        (bin_dir / tool).symlink_to(subprocess.check_output(["which", tool], text=True).strip())
    log = tmp_path / "python3.log"
    (bin_dir / "python3").write_text(f'#!/bin/sh\necho "$*" >> {log}\nexit 7\n')
    (bin_dir / "python3").chmod(0o755)
    env = {"PATH": str(bin_dir), "OUT": str(tmp_path / "out"), "AUTOTUNE_WHEELS": str(tmp_path / "none")}
    proc = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    # No `python` on the PATH: the script asked python3 whether the dependencies are there (they
    # are not, here), then said where the wheels were to come from.
    assert proc.returncode == 1 and "no wheels in " in proc.stdout, proc.stdout + proc.stderr
    assert log.read_text().startswith("-c import optuna, sqlalchemy"), log.read_text()


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


@pytest.mark.slow
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
    doctor = {
        "device": {"kind": "cuda", "name": "NVIDIA H200"},
        "versions": {"torch": "2.11.0+cu130"},
        "matmul": {"flops_per_sec": 800e12, "detail": "bf16 8192^3"},
    }
    (tmp_path / "doctor.json").write_text(json.dumps(doctor))
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
    probe = {"weight_grad_zero_fraction": 0.0, "weight_grad_rel_error": 0.001, "hidden_grad_rel_error": 0.001}
    (tmp_path / "probes.json").write_text(
        json.dumps(
            {
                "fp16_chunked": {
                    "tokens": 32768,
                    "loss_scale": 65536.0,
                    "standard": {**probe, "agrees": True},
                    "chunked": {**probe, "weight_grad_zero_fraction": 0.999, "agrees": False},
                },
                "fork_server": {
                    "outcome": "ok",
                    "forked": True,
                    "server_started_cuda": False,
                    "spawn_to_ready_s": 0.4,
                    "ok": True,
                },
            }
        )
    )
    (tmp_path / "steps.tsv").write_text("doctor\t0\t20\t45\nsearch\t0\t150\t190\n")
    assert gpu_table.main(str(tmp_path), "0") == 0
    lines = capsys.readouterr().out.splitlines()
    assert "gpt2 on NVIDIA H200, torch 2.11.0+cu130" in lines
    table = [line.split(" | ") for line in lines if line.startswith("| ")]
    header = [cell.strip("| ") for cell in table[0]]
    assert header == gpu_table.HEADERS
    rows = {row[0].strip("| "): [cell.strip("| ") for cell in row] for row in table[1:]}
    base = rows["baseline (fp32 eager math, fixed 8x seq)"]
    best = rows["search best (trial 5)"]
    assert best[1:4] == ["400,000", "40.00x", "4.00x"]
    assert best[4:8] == ["40.0%", f"{0.4 * 989 / 800:.1%}", "50.0%", f"{0.5 * 989 / 800:.1%}"]
    assert best[8:] == ["1024 MiB", "nvml-device", "10.0%", "42.0", "0", "no", "ok"]
    assert base[5] == f"{0.02 * 66.9 / 800:.1%}"  # achieved FLOP/s of a float32 run over the measured bf16 peak
    assert base[9] == "nvml-process" and base[10] == "60.0%"
    assert rows["checklist (bf16 compile flash, pinned, 4 workers)"][13] == "UNSTABLE"
    assert "measured peak: 800 TFLOP/s (measured here: bf16 8192^3)" in lines
    assert any("fp16 + chunked loss" in line and "99.9% zeros" in line and line.endswith("WRONG") for line in lines)
    assert any("fp16 + standard loss" in line and line.endswith("AGREES") for line in lines)
    assert any(line.startswith("fork-server probe: trial ok") and line.endswith("OK") for line in lines)
    assert lines[-1] == "steps: doctor 20 s (rc 0), search 150 s (rc 0)"
    figures = json.loads((tmp_path / "figures.json").read_text())
    assert figures["rows"][2] == best and figures["measured_peak_flops"] == 800e12


@pytest.mark.slow
def test_the_table_checks_the_plan_against_the_peaks_the_search_measured(tmp_path, capsys):
    """The first GPU run tests `autotune plan` too: its prior beside each peak the search measured,
    and the model fitted to the other trials. Here the peaks are 1.25x the prior: -20 %."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_table
    import optuna

    from autotune.config import TrainConfig
    from autotune.search.memory_model import memory_context
    from autotune.search.plan import plan_task
    from autotune.search.settings import SearchSettings

    task = plan_task(SearchSettings(model="gpt2"), "h200")
    study = optuna.create_study(study_name="gpucheck", storage=f"sqlite:///{tmp_path / 'gpucheck.db'}")
    for key, value in task.record().attrs().items():
        study.set_user_attr(key, value)
    for budget in (8192, 32768):
        config = {**TrainConfig().to_dict(), "token_budget": budget, "amp_dtype": "bfloat16"}
        prior = memory_context(task).prior(config)
        peak = int(1.25 * (prior.static + prior.per_token * budget))
        attrs = {"outcome": "ok", "config": config, "tokens_per_sec": 1e5, "peak_memory_bytes": peak}
        study.add_trial(optuna.trial.create_trial(value=1e5, user_attrs=attrs))
    assert gpu_table.main(str(tmp_path), "0") == 0
    assert "plan: its prior -20% to -20% of the 2 measured peaks, fitted to the other trials" in capsys.readouterr().out
    assert len(json.loads((tmp_path / "figures.json").read_text())["plan"]) == 2


def test_without_a_measured_peak_an_h200_is_judged_against_the_published_one(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_table

    peak, source = gpu_table.measured_peak({"device": {"name": "NVIDIA H200"}})
    assert peak == 790e12 and source.startswith("not measured here")
    assert gpu_table.measured_peak({"device": {"name": "NVIDIA A100"}}) == (None, "no measured peak")


@pytest.mark.process
@pytest.mark.compile  # the doctor's check compiles for real
def test_the_dry_run_installs_offline_and_brings_back_at_most_six_files(gpu_check_run):
    proc, out = gpu_check_run  # run in the background from the session's start (conftest)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("DRY RUN")
    assert "| run | eff. tokens/s | x baseline | x checklist | MFU mean len (datasheet) |" in proc.stdout
    for row in ("| baseline (fp32 eager math, fixed 8x seq) | ", "| search best (trial 0) | "):
        assert row in proc.stdout
    assert re.search(r"^fp16 \+ chunked loss, 256 tokens, .*: (AGREES|WRONG)$", proc.stdout, flags=re.M)
    assert re.search(
        r"^fork-server probe: trial ok, forked from the server: yes, server started CUDA: False",
        proc.stdout,
        flags=re.M,
    )
    files = sorted(p.name for p in out.iterdir())
    assert files == ["figures.json", "gpu_check.tar.gz", "table.md"]  # at most 6 come back from the machine
    with tarfile.open(out / "gpu_check.tar.gz") as tar:
        names = {Path(n).name for n in tar.getnames()}
        steps = [line.split("\t") for line in tar.extractfile("./steps.tsv").read().decode().splitlines()]
        deps = tar.extractfile("./deps.txt").read().decode()
        doctor = json.loads(tar.extractfile("./doctor.json").read())
        generate = json.loads(tar.extractfile("./generate.json").read())
    assert {"doctor.json", "probes.json", "search.json", "gpucheck.db", "recipe.json", "search.err"} <= names
    steps_run = ["dependencies", "doctor", "probes", "generate", "llama", "search"]
    assert [s[0] for s in steps] == steps_run and all(s[1] == "0" for s in steps)
    # The bounded generation step: its figures, in the table and in figures.json.
    assert generate["outcome"] == "ok" and generate["generation"]["cache"] == "static"
    assert re.search(r"^generate \(ok\): .* output tok/s at batch 1, TTFT p50/p99 ", proc.stdout, flags=re.M)
    assert json.loads((out / "figures.json").read_text())["generate"]["generation"]["new_tokens"] == 8
    if WHEELHOUSE.is_dir():  # .ci/run builds it: optuna came from it, installed offline, not from site-packages
        assert "autotune-gpucheck-site-" in deps, deps
    # Issue G's case: a Llama's checkpointed blocks under the forced math kernel (eager on a CPU).
    assert re.search(
        r"^llama \(checkpointed blocks \[0, 1\], compile none, math kernel, padded batches\): ok, ",
        proc.stdout,
        flags=re.M,
    )
    # `autotune doctor` on this CPU, in a fresh process: torch.compile works here, for real.
    assert doctor["device"]["kind"] == "cpu" and doctor["compile"]["ok"] is True, doctor["compile"]


def _process_holding(tmp_path: Path, load: str = "", open_path: str = "") -> subprocess.Popen:
    """A process that has loaded a library and/or holds a file open, until its stdin closes."""
    code = (
        "import ctypes, sys\n"
        f"lib = ctypes.CDLL({load!r}) if {bool(load)!r} else None\n"
        f"held = open({open_path!r}) if {bool(open_path)!r} else None\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_the_fork_server_probe_is_not_fooled_by_a_mapped_but_unstarted_cuda_driver(tmp_path):
    """`import torch` of a CUDA build maps libcuda.so.1 (cuBLASLt loads it) without starting CUDA:
    a stub of that name, mapped, is no CUDA start (the probe said True: FAILED on every GPU host);
    what cuInit leaves, an open unified-memory device, is (a file stands in for it here)."""
    import _ctypes

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_probes import started_cuda

    stub = tmp_path / "libcuda.so.1"
    # Any shared library named as the driver: this Python's own ctypes extension, always there.
    stub.write_bytes(Path(_ctypes.__file__).read_bytes())
    uvm = tmp_path / "nvidia-uvm"
    uvm.write_text("")
    mapped = _process_holding(tmp_path, load=str(stub))
    started = _process_holding(tmp_path, open_path=str(uvm))
    try:
        assert "libcuda.so" in Path(f"/proc/{mapped.pid}/maps").read_text()  # the stub is mapped
        assert started_cuda(mapped.pid) is False
        assert started_cuda(started.pid, mark=str(uvm)) is True
        assert started_cuda(2**22 + 1) is None  # no such process: unreadable, not "no"
    finally:
        for proc in (mapped, started):
            proc.communicate("")
