"""Reads what benchmarks/gpu_check.sh wrote and prints its one table.

Rows: the baseline and the checklist (the search's reference trials, read from its study),
the strong hand-picked configuration (`bench`), the search's best, and the verify run of
its recipe. Columns: effective tokens/s; speedups over the baseline and the checklist; MFU
at the mean padded length and at the full context, each against the datasheet peak and
against 790 TFLOP/s (a real H200's large bf16 matmul); peak memory and where it was read
(nvml-process, nvml-device in a container, allocator-reserved without NVML, rss on CPU);
padding; compile time; compile events in the timed window; the unstable flag. Also writes
baseline.json and checklist.json (the reference trials' measurements) beside the others."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import _common  # noqa: F401
from _common import md_table, mib

from autotune.device import peak_flops
from autotune.device.flops import MEASURED_PEAK_FLOPS

MEASURED_H200_BF16 = MEASURED_PEAK_FLOPS["H200"][0]["bfloat16"]  # a real H200's large bf16 matmul: 790 TFLOP/s

HEADERS = [
    "run",
    "eff. tokens/s",
    "x baseline",
    "x checklist",
    "MFU mean len (datasheet)",
    "MFU mean len (790T)",
    "MFU full ctx (datasheet)",
    "MFU full ctx (790T)",
    "peak memory",
    "memory source",
    "padding",
    "compile s",
    "recompiles timed",
    "unstable",
    "outcome",
]


def load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def reference_measurements(db: Path) -> dict[str, dict[str, Any]]:
    """The baseline's and the checklist's measurements, from the search's study."""
    if not db.exists():
        return {}
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        study = optuna.load_study(study_name="gpucheck", storage=f"sqlite:///{db}")
    except Exception:  # noqa: BLE001 (no study: the search never started)
        return {}
    found: dict[str, dict[str, Any]] = {}
    for trial in study.trials:
        name, m = trial.user_attrs.get("reference"), trial.user_attrs.get("measurement")
        if name and isinstance(m, dict):
            found[name] = m
    return found


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def speedup(tps: float, ref: float | None) -> str:
    return f"{tps / ref:.2f}x" if ref else "-"


def row(name: str, m: dict | None, base_tps: float | None, check_tps: float | None) -> list[str]:
    if not m or m.get("tokens_per_sec") is None:
        reason = ((m or {}).get("reason") or "").splitlines()[:1]
        return [name] + ["-"] * (len(HEADERS) - 2) + [" ".join([(m or {}).get("outcome", "missing")] + reason)]
    tps = m["tokens_per_sec"]
    device = (m.get("device") or {}).get("name", "")
    dtype = (m.get("config") or {}).get("amp_dtype", "bfloat16")
    peak = peak_flops(device, dtype)

    def at_790(mfu: float | None) -> float | None:
        return mfu * peak / MEASURED_H200_BF16 if mfu is not None and peak else None

    mfu, mfu_full = m.get("mfu"), m.get("mfu_at_context")
    compile_s = m.get("compile_time_s")
    return [
        name,
        f"{tps:,.0f}",
        speedup(tps, base_tps),
        speedup(tps, check_tps),
        pct(mfu),
        pct(at_790(mfu)),
        pct(mfu_full),
        pct(at_790(mfu_full)),
        mib(m.get("peak_memory_bytes")),
        m.get("peak_memory_source") or "-",
        pct(m.get("padding_fraction")),
        "-" if compile_s is None else f"{compile_s:.1f}",
        str(m.get("recompiles_during_timing", "-")),
        "UNSTABLE" if m.get("unstable") else "no",
        m.get("outcome", "ok"),
    ]


def main(out_dir: str, dry_run: str) -> int:
    d = Path(out_dir)
    refs = reference_measurements(d / "gpucheck.db")
    for name in ("baseline", "checklist"):
        if name in refs:
            (d / f"{name}.json").write_text(json.dumps(refs[name], indent=2))
    base, check = refs.get("baseline"), refs.get("checklist")
    strong, search, verify = load(d / "strong.json"), load(d / "search.json"), load(d / "verify.json")
    base_tps = (base or {}).get("tokens_per_sec")
    check_tps = (check or {}).get("tokens_per_sec")
    best = (search or {}).get("best") or {}
    verified = None
    if verify:
        verified = {**(verify.get("measured") or {}), "outcome": verify.get("outcome", "missing")}
        verified.setdefault("device", (best.get("measurement") or {}).get("device"))
        verified.setdefault("config", best.get("config"))
    rows = [
        row("baseline (fp32 eager math, fixed 8x seq)", base, base_tps, check_tps),
        row("checklist (bf16 compile flash, pinned, 4 workers)", check, base_tps, check_tps),
        row("strong hand-picked (bench)", strong, base_tps, check_tps),
        row(f"search best (trial {best.get('number', '?')})", best.get("measurement"), base_tps, check_tps),
        row("verify of the search recipe", verified, base_tps, check_tps),
    ]
    device = ((base or strong or {}).get("device") or {}).get("name", "?")
    head = (
        "DRY RUN (no GPU): gpt2-tiny on CPU, tiny step counts; figures are meaningless"
        if dry_run == "1"
        else f"gpt2 on {device}"
    )
    print(f"\n{head}\n")
    print(md_table(HEADERS, rows))
    if search:
        print(
            f"\nsearch: {search.get('n_trials')} trials {search.get('counts')}, best's speedup over the baseline "
            f"{search.get('speedup_vs_baseline')}, over the checklist {search.get('speedup_vs_checklist')}"
        )
    if verify:
        print(f"verify: passed={verify.get('passed')} ratio_tokens_per_sec={verify.get('ratio_tokens_per_sec')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "0"))
