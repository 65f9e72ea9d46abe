"""Reads what benchmarks/gpu_check.sh wrote in its work folder, prints its one table and writes
figures.json beside it.

Rows: the baseline and the checklist (the search's reference trials, read from its study) and
the search's best (from its report, else from its study). Columns: effective tokens/s; speedups
over the baseline and the checklist;
MFU at the mean padded length and at the full context, each against the datasheet peak and
against the peak `autotune doctor` measured on this device (a large bf16 matmul; on a machine
whose doctor measured none, the 790 TFLOP/s an H200 reached here, said as such); peak memory and
where it was read (nvml-process, nvml-device in a container, allocator-reserved without NVML, rss
on CPU); padding; compile time; compile events in the timed window; the unstable flag. Then
`autotune plan`'s memory prior against the search's measured peaks, the generation step, the
Llama step (checkpointed blocks compiled under a forced kernel), the two probes
(benchmarks/gpu_probes.py) and each step's time.

    python benchmarks/gpu_table.py WORK_DIR DRY(0|1)"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import _common  # noqa: F401
from _common import md_table, mib

from autotune.device import peak_flops
from autotune.device.flops import MEASURED_PEAK_FLOPS

PUBLISHED_H200_BF16 = MEASURED_PEAK_FLOPS["H200"][0]["bfloat16"]  # a lent H200's 8192^3 bf16 matmul: 790 TFLOP/s

HEADERS = [
    "run",
    "eff. tokens/s",
    "x baseline",
    "x checklist",
    "MFU mean len (datasheet)",
    "MFU mean len (measured peak)",
    "MFU full ctx (datasheet)",
    "MFU full ctx (measured peak)",
    "peak memory",
    "memory source",
    "padding",
    "compile s",
    "recompiles timed",
    "unstable",
    "outcome",
]


def load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _trials(db: Path) -> list[Any]:
    """The search's finished trials, from its study (none where the search never started)."""
    if not db.exists():
        return []
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        study = optuna.load_study(study_name="gpucheck", storage=f"sqlite:///{db}")
    except Exception:  # noqa: BLE001 (no study: the search never started)
        return []
    return [t for t in study.trials if isinstance(t.user_attrs.get("measurement"), dict)]


def reference_measurements(db: Path) -> dict[str, dict[str, Any]]:
    """The baseline's and the checklist's measurements, from the search's study."""
    return {
        t.user_attrs["reference"]: t.user_attrs["measurement"] for t in _trials(db) if t.user_attrs.get("reference")
    }


def best_in_study(db: Path) -> dict[str, Any]:
    """The search's best as `search --json` gives it (number, measurement), read from the study:
    the fastest `ok` trial, for when the search was stopped before it could write its report."""
    measured = [t for t in _trials(db) if t.user_attrs["measurement"].get("outcome") == "ok"]
    if not measured:
        return {}
    best = max(measured, key=lambda t: t.user_attrs["measurement"].get("tokens_per_sec") or 0.0)
    return {"number": best.number, "measurement": best.user_attrs["measurement"], "from_study": True}


def measured_peak(doctor: dict[str, Any] | None) -> tuple[float | None, str]:
    """(FLOP/s, where it comes from): the doctor's own matmul on this device, else the published
    H200 figure on an H200, else none."""
    matmul = (doctor or {}).get("matmul") or {}
    if matmul.get("flops_per_sec"):
        return float(matmul["flops_per_sec"]), f"measured here: {matmul.get('detail') or 'a large matmul'}"
    name = ((doctor or {}).get("device") or {}).get("name", "")
    if "H200" in name:
        return PUBLISHED_H200_BF16, "not measured here: 790 TFLOP/s, an H200's bf16 matmul in the device library"
    return None, "no measured peak"


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def speedup(tps: float, ref: float | None) -> str:
    return f"{tps / ref:.2f}x" if ref else "-"


def row(name: str, m: dict | None, base_tps: float | None, check_tps: float | None, peak: float | None) -> list[str]:
    if not m or m.get("tokens_per_sec") is None:
        reason = ((m or {}).get("reason") or "").splitlines()[:1]
        return [name] + ["-"] * (len(HEADERS) - 2) + [" ".join([(m or {}).get("outcome", "missing")] + reason)]
    tps = m["tokens_per_sec"]
    device = (m.get("device") or {}).get("name", "")
    datasheet = peak_flops(device, (m.get("config") or {}).get("amp_dtype", "bfloat16"))

    def against_measured(mfu: float | None) -> float | None:
        # achieved FLOP/s (MFU x the datasheet peak of the run's dtype) over the measured bf16 rate
        return mfu * datasheet / peak if mfu is not None and datasheet and peak else None

    mfu, mfu_full = m.get("mfu"), m.get("mfu_at_context")
    compile_s = m.get("compile_time_s")
    return [
        name,
        f"{tps:,.0f}",
        speedup(tps, base_tps),
        speedup(tps, check_tps),
        pct(mfu),
        pct(against_measured(mfu)),
        pct(mfu_full),
        pct(against_measured(mfu_full)),
        mib(m.get("peak_memory_bytes")),
        m.get("peak_memory_source") or "-",
        pct(m.get("padding_fraction")),
        "-" if compile_s is None else f"{compile_s:.1f}",
        str(m.get("recompiles_during_timing", "-")),
        "UNSTABLE" if m.get("unstable") else "no",
        m.get("outcome", "ok"),
    ]


def probe_lines(probes: dict[str, Any] | None) -> list[str]:
    if not probes:
        return ["probes: no report (see probes.err in the tarball)"]
    lines = []
    loss = probes.get("fp16_chunked") or {}
    if "error" in loss or not loss:
        lines.append(f"fp16 + chunked loss probe: {loss.get('error', 'missing')}")
    else:
        for impl in ("standard", "chunked"):
            r = loss[impl]
            lines.append(
                f"fp16 + {impl} loss, {loss['tokens']:,} tokens, scale {loss['loss_scale']:g}: head-weight gradient "
                f"{r['weight_grad_zero_fraction']:.1%} zeros, error against fp32 {r['weight_grad_rel_error']:.2%} "
                f"(weight), {r['hidden_grad_rel_error']:.2%} (hidden): {'AGREES' if r['agrees'] else 'WRONG'}"
            )
    fork = probes.get("fork_server") or {}
    if "error" in fork or not fork:
        lines.append(f"fork-server probe: {fork.get('error', 'missing')}")
    else:
        ready = fork.get("spawn_to_ready_s")
        lines.append(
            f"fork-server probe: trial {fork['outcome']}, forked from the server: {'yes' if fork['forked'] else 'NO'}, "
            f"server started CUDA: {fork['server_started_cuda']}, spawn to ready "
            f"{'-' if ready is None else f'{ready:.2f} s'}: {'OK' if fork['ok'] else 'FAILED'}"
        )
    return lines


def generation_line(m: dict[str, Any] | None) -> str:
    """The generation step's figures in one line (bench --task generate --json)."""
    if not m:
        return "generate: no report (see generate.err in the tarball)"
    g = m.get("generation") or {}

    def ms(key: str) -> str:
        return "-" if g.get(key) is None else f"{1000 * g[key]:.2f} ms"

    agreement = g.get("agreement") or {}
    return (
        f"generate ({m.get('outcome')}): {m.get('tokens_per_sec') or 0:,.0f} output tok/s at batch "
        f"{g.get('batch_size')}, "
        f"TTFT p50/p99 {ms('ttft_p50_s')}/{ms('ttft_p99_s')}, per token p50/p99 "
        f"{ms('token_latency_p50_s')}/{ms('token_latency_p99_s')}, compile {m.get('compile_time_s') or 0:.1f} s, "
        f"{m.get('recompiles_during_timing')} recompiles while timed, tokens agree with fp32 up to "
        f"{agreement.get('agreed_min')} of {agreement.get('new_tokens')} (required {agreement.get('required')})"
    )


def llama_line(m: dict[str, Any] | None) -> str:
    """The Llama step's verdict in one line: checkpointed blocks compiled under a forced kernel."""
    if not m:
        return "llama (checkpointed blocks, compiled, forced kernel): no report (see llama.err in the tarball)"
    cfg = m.get("config") or {}
    reason = (m.get("reason") or "").splitlines()[:1]
    return (
        f"llama (checkpointed blocks {cfg.get('checkpoint_layers')}, compile {cfg.get('compile_mode')}, "
        f"{cfg.get('sdpa_backend')} kernel, {cfg.get('batching')} batches): {m.get('outcome')}, "
        f"{m.get('tokens_per_sec') or 0:,.0f} tok/s, {m.get('recompiles_during_timing')} recompiles while timed"
        + (f": {reason[0]}" if reason else "")
    )


def plan_line(db: Path) -> tuple[str, list[dict[str, Any]]]:
    """`autotune plan`'s memory model against the search's measured peaks (docs/plan.md): its prior,
    as the plan predicts before any trial, and the model fitted to the other trials."""
    try:
        from autotune.search.plan import make_plan, study_task

        task, records = study_task("gpucheck", f"sqlite:///{db}")
        rows = make_plan(task, records=records)["calibration"]
    except Exception as exc:  # noqa: BLE001 (no study, or not one the plan reads)
        return f"plan: no study to check it against ({str(exc)[:160]})", []
    if not rows:
        return "plan: no measured peak to check it against", []

    def band(key: str) -> str:
        errors = [r[key] / r["measured_bytes"] - 1 for r in rows]
        return f"{min(errors):+.0%} to {max(errors):+.0%}"

    return (
        f"plan: its prior {band('prior_bytes')} of the {len(rows)} measured peaks, fitted to the other trials "
        f"{band('calibrated_bytes')} (predicted / measured - 1)",
        rows,
    )


def steps(work: Path) -> list[list[str]]:
    try:
        return [line.split("\t") for line in (work / "steps.tsv").read_text().splitlines() if line]
    except OSError:
        return []


def main(work_dir: str, dry_run: str) -> int:
    work = Path(work_dir)
    refs = reference_measurements(work / "gpucheck.db")
    doctor, probes, search = load(work / "doctor.json"), load(work / "probes.json"), load(work / "search.json")
    base, check = refs.get("baseline"), refs.get("checklist")
    base_tps = (base or {}).get("tokens_per_sec")
    check_tps = (check or {}).get("tokens_per_sec")
    # A search stopped at its cap writes no report: its best is still in the study.
    best = (search or {}).get("best") or best_in_study(work / "gpucheck.db")
    where = ", read from the study: the search wrote no report" if best.get("from_study") else ""
    peak, peak_source = measured_peak(doctor)
    runs = [
        ("baseline (fp32 eager math, fixed 8x seq)", base),
        ("checklist (bf16 compile flash, pinned, 4 workers)", check),
        (f"search best (trial {best.get('number', '?')}{where})", best.get("measurement")),
    ]
    rows = [row(name, m, base_tps, check_tps, peak) for name, m in runs]
    device = (doctor or {}).get("device") or {}
    versions = (doctor or {}).get("versions") or {}
    head = (
        "DRY RUN (no GPU): gpt2-tiny on CPU, tiny step counts; figures are meaningless"
        if dry_run == "1"
        else f"gpt2 on {device.get('name', '?')}, torch {versions.get('torch', '?')}"
    )
    print(f"\n{head}\n")
    print(md_table(HEADERS, rows))
    print(f"\nmeasured peak: {'-' if peak is None else f'{peak / 1e12:.0f} TFLOP/s'} ({peak_source})")
    if search:
        print(
            f"search: {search.get('n_trials')} trials {search.get('counts')}, best's speedup over the baseline "
            f"{search.get('speedup_vs_baseline')}, over the checklist {search.get('speedup_vs_checklist')}"
        )
    plan, plan_rows = plan_line(work / "gpucheck.db")
    print(plan)
    generate = load(work / "generate.json")
    print(generation_line(generate))
    llama = load(work / "llama.json")
    print(llama_line(llama))
    for line in probe_lines(probes):
        print(line)
    print("steps: " + ", ".join(f"{s[0]} {s[2]} s (rc {s[1]})" for s in steps(work) if len(s) >= 3))
    figures = {
        "dry_run": dry_run == "1",
        "device": device,
        "versions": versions,
        "measured_peak_flops": peak,
        "measured_peak_source": peak_source,
        "headers": HEADERS,
        "rows": rows,
        "runs": {name: m for name, m in runs},
        "search": {
            k: (search or {}).get(k) for k in ("n_trials", "counts", "speedup_vs_baseline", "speedup_vs_checklist")
        },
        "probes": probes,
        "plan": plan_rows,
        "generate": generate,
        "llama": llama,
        "steps": steps(work),
    }
    (work / "figures.json").write_text(json.dumps(figures, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "0"))
