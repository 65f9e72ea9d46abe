"""Reads the JSON files benchmarks/gpu_check.sh wrote and prints its one table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import _common  # noqa: F401
from _common import md_table, mib

from autotune.device import peak_flops

MEASURED_H200_BF16 = 790e12  # mission.md: a real H200 measured about 790 TFLOP/s on a large bf16 matmul


def load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def row(name: str, m: dict | None, cfg: dict | None, device_name: str, base_tps: float | None) -> list[str]:
    if not m or m.get("tokens_per_sec") is None:
        return [name, "-", "-", "-", "-", "-", "-", "-", (m or {}).get("outcome", "missing")]
    tps, mfu = m["tokens_per_sec"], m.get("mfu")
    dtype = (cfg or {}).get("amp_dtype", "bfloat16")
    peak = peak_flops(device_name, dtype)
    mfu790 = mfu * peak / MEASURED_H200_BF16 if mfu is not None and peak else None
    pct = lambda v: "-" if v is None else f"{v:.1%}"  # noqa: E731
    nvml = m.get("peak_memory_bytes") if (m.get("peak_memory_source") or "").startswith("nvml") else None
    return [
        name,
        f"{tps:,.0f}",
        pct(mfu),
        pct(mfu790),
        mib(nvml if nvml else m.get("peak_memory_bytes")),
        mib(m.get("allocator_peak_bytes")),
        f"{tps / base_tps:.2f}x" if base_tps else "-",
        pct(m.get("step_time_cv")),
        m.get("outcome", "ok"),
    ]


def main(out_dir: str, dry_run: str) -> int:
    d = Path(out_dir)
    base, check, strong = load(d / "baseline.json"), load(d / "checklist.json"), load(d / "strong.json")
    search, verify = load(d / "search.json"), load(d / "verify.json")
    device_name = ((base or {}).get("device") or {}).get("name", "?")
    base_tps = (base or {}).get("tokens_per_sec")
    best = (search or {}).get("best") or {}
    rows = [
        row("baseline (fp32 eager math, fixed 8x seq)", base, (base or {}).get("config"), device_name, base_tps),
        row("checklist (bench)", check, (check or {}).get("config"), device_name, base_tps),
        row("strong hand-picked (bench)", strong, (strong or {}).get("config"), device_name, base_tps),
        row(
            f"search best (trial {best.get('number', '?')})",
            best.get("measurement"),
            best.get("config"),
            device_name,
            base_tps,
        ),
        row(
            "verify of the search recipe",
            {**((verify or {}).get("measured") or {}), "outcome": (verify or {}).get("outcome", "missing")},
            best.get("config"),
            device_name,
            base_tps,
        ),
    ]
    head = (
        "DRY RUN (no GPU): gpt2-tiny on CPU, tiny step counts; figures are meaningless"
        if dry_run == "1"
        else f"gpt2 on {device_name}"
    )
    print(f"\n{head}\n")
    print(
        md_table(
            [
                "run",
                "tokens/s",
                "MFU (table peak)",
                "MFU (790 TFLOP/s)",
                "peak mem (NVML/RSS)",
                "allocator peak",
                "vs baseline",
                "step CV",
                "outcome",
            ],
            rows,
        )
    )
    if search:
        print(
            f"\nsearch: {search.get('n_trials')} trials {search.get('counts')}, "
            f"speedup vs baseline {search.get('speedup_vs_baseline')}, "
            f"vs checklist {search.get('speedup_vs_checklist')}"
        )
    if verify:
        print(f"verify: passed={verify.get('passed')} ratio_tokens_per_sec={verify.get('ratio_tokens_per_sec')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "0"))
