"""Issue 3/6's knobs on and off on this CPU: each variant measured by `autotune bench` (a
process of its own, the measuring loop that serves search and verify).

    python benchmarks/knob_table.py [--json] [--models gpt2-tiny benchmarks.cpu_models:gpt2_4x256]

On a CPU these figures show that each knob takes effect (a compiled scope compiles, the
chunked loss holds less, packed batches have no pads, accumulation steps the optimizer less
often, a knob the CPU cannot run is refused with its reason), not what it gains on a GPU."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import _common  # noqa: F401
from _common import md_table

BASE = ["--set", "num_workers=0", "--set", "token_budget=2048"]
VARIANTS: list[tuple[str, list[str]]] = [
    ("baseline (padded, eager, standard loss)", []),
    ("compile blocks", ["--set", "compile_mode=default", "--set", "compile_scope=blocks"]),
    ("compile blocks+head", ["--set", "compile_mode=default", "--set", "compile_scope=blocks+head"]),
    ("compile model", ["--set", "compile_mode=default", "--set", "compile_scope=model"]),
    ("loss_impl chunked", ["--set", "loss_impl=chunked"]),
    ("batching packed", ["--batching", "packed"]),
    ("packed + attention_mask document", ["--batching", "packed", "--set", "attention_mask=document"]),
    ("expandable_segments", ["--set", "expandable_segments=true"]),
    ("global batch 8192 (4 micro-steps)", ["--global-batch-tokens", "8192"]),
]


def bench(model: str, extra: list[str], steps: int) -> tuple[dict, float]:
    started = time.perf_counter()
    args = ["bench", "--model", model, "--device", "cpu", "--warmup", "1", "--steps", str(steps), "--min-time", "0"]
    proc = subprocess.run(
        [sys.executable, "-m", "autotune", *args, *BASE, *extra, "--json"], capture_output=True, text=True
    )
    wall = time.perf_counter() - started
    try:
        return json.loads(proc.stdout), wall  # measured, or a failed outcome (exit 1) with its reason
    except json.JSONDecodeError:  # refused before measuring (exit 2): its one line
        lines = proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"]
        return {"outcome": "refused", "reason": lines[-1]}, wall


def row(model: str, name: str, m: dict, wall: float) -> list[str]:
    def mib(value):
        return f"{value / 2**20:,.0f}" if value else "-"

    ok = m.get("outcome") == "ok"
    return [
        model.rsplit(":", 1)[-1],
        name,
        m.get("outcome", "?") if ok else f"{m.get('outcome')}: {m.get('reason', '')[:70]}",
        f"{m['tokens_per_sec']:,.0f}" if ok else "-",
        f"{m['padding_fraction']:.1%}" if ok else "-",
        mib(m.get("peak_memory_bytes")) if ok else "-",
        f"{m.get('compile_time_s') or 0:.1f}" if ok else "-",
        f"{m.get('step_time_cv', 0):.1%}" if ok else "-",
        str(m.get("optimizer_steps", "-")) if ok else "-",
        f"{wall:.0f}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpt2-tiny", "benchmarks.cpu_models:gpt2_4x256"])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows, raw = [], []
    for model in args.models:
        for name, extra in VARIANTS:
            m, wall = bench(model, extra, args.steps)
            raw.append({"model": model, "variant": name, "measurement": m, "wall_s": wall})
            rows.append(row(model, name, m, wall))
    if args.json:
        print(json.dumps(raw, indent=2))
        return
    head = (
        "model",
        "variant",
        "outcome",
        "tok/s",
        "padding",
        "peak MiB",
        "compile s",
        "step CV",
        "opt steps",
        "wall s",
    )
    print(md_table(head, rows))


if __name__ == "__main__":
    main()
