"""How far `autotune plan`'s memory figures (the search's memory model before any trial: its
analytic prior) are from the peak a real run reaches on this CPU, across the families of knobs
that move memory: `autotune bench --json`'s peak memory (the process's peak RSS), one fresh
process per configuration.

    python benchmarks/plan_accuracy.py [--json] [--models gpt2-tiny gpt2] [--out FILE]
    python benchmarks/plan_accuracy.py --from benchmarks/results/2026-12-05/plan_accuracy.json  # its table again

gpt2-tiny: every family (float32 and bfloat16 x math and flash attention x the standard and the
chunked loss x none or both blocks checkpointed) at 2,048 and 16,384 tokens. gpt2 (124M) takes
minutes a step on two cores: float32 and flash attention, the standard loss, nothing checkpointed,
at 512 and 2,048 tokens of 256-token sequences, and each of math attention, the chunked loss and
all 12 blocks checkpointed changed alone at 512 (bfloat16 is emulated on a CPU without bf16
units: tens of minutes a step). Error = predicted / measured - 1."""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import subprocess
import sys

import _common  # noqa: F401
from _common import ROOT, md_table

from autotune.config import TrainConfig
from autotune.search.memory_model import MemoryModel, memory_context
from autotune.search.plan import plan_task
from autotune.search.settings import SearchSettings
from autotune.units import format_bytes

LIMIT = 16 * 2**30  # far above every run: the limit moves no prediction, and no run is stopped


def runs(model: str) -> list[tuple[int | None, dict]]:
    """(seq_len, knobs) of each run of `model`."""
    if model == "gpt2-tiny":
        grid = list(itertools.product(("float32", "bfloat16"), ("math", "flash"), ("standard", "chunked"), (0, 2)))
        return [
            (None, {"token_budget": b, "amp_dtype": d, "sdpa_backend": k, "loss_impl": loss, "checkpoint_layers": n})
            for b in (2048, 16384)
            for d, k, loss, n in grid
        ]
    base = {"token_budget": 512, "amp_dtype": "float32", "sdpa_backend": "flash", "loss_impl": "standard"}
    changes = [{}, {"token_budget": 2048}, {"sdpa_backend": "math"}, {"loss_impl": "chunked"}]
    return [(256, {**base, "checkpoint_layers": 0, **c}) for c in changes] + [(256, {**base, "checkpoint_layers": 12})]


def measure(model: str, seq_len: int | None, knobs: dict) -> dict:
    sets = [f"{k}={','.join(map(str, range(v))) if k == 'checkpoint_layers' else v}" for k, v in knobs.items()]
    cmd = [sys.executable, "-m", "autotune", "bench", "--model", model, "--device", "cpu", "--json"]
    cmd += ["--warmup", "1", "--steps", "2", "--min-time", "0"]
    cmd += ["--seq-len", str(seq_len)] if seq_len else []
    for s in sets:
        cmd += ["--set", s]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        return {"outcome": "crashed", "reason": done.stderr.strip().splitlines()[-1:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpt2-tiny", "gpt2"])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", help="also write the rows as JSON here")
    parser.add_argument("--from", dest="saved", help="print the table of a saved result (--out) instead of measuring")
    args = parser.parse_args()
    if args.saved:
        with open(args.saved, encoding="utf-8") as f:
            print(table(json.load(f)))
        return
    rows = []
    for model in args.models:
        for seq_len, knobs in runs(model):
            task = plan_task(SearchSettings(model=model, seq_len=seq_len, memory_limit_bytes=LIMIT), "current")
            config = {**TrainConfig().to_dict(), **knobs, "checkpoint_layers": list(range(knobs["checkpoint_layers"]))}
            predicted = MemoryModel(memory_context(task), LIMIT).predict(config)
            measured = measure(model, seq_len, knobs)
            peak = measured.get("peak_memory_bytes")
            rows.append(
                {
                    "model": model,
                    "seq_len": task.space.seq_len,
                    **knobs,
                    "outcome": measured.get("outcome"),
                    "measured_bytes": peak,
                    "predicted_bytes": predicted.peak_bytes,
                    "low_bytes": predicted.low_bytes,
                    "high_bytes": predicted.high_bytes,
                    "error": predicted.peak_bytes / peak - 1 if peak else None,
                }
            )
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    result = {"date": datetime.date.today().isoformat(), "device": task.device.name, "rows": rows}
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(table(result))


def table(result: dict) -> str:
    """The rows as a Markdown table, and the error's range over them."""
    rows = result["rows"]
    headers = ["model", "tokens", "dtype", "attention", "loss", "ckpt", "measured", "predicted (95 %)", "error"]
    out = md_table(
        headers,
        [
            [
                r["model"],
                r["token_budget"],
                r["amp_dtype"],
                r["sdpa_backend"],
                r["loss_impl"],
                r["checkpoint_layers"],
                format_bytes(r["measured_bytes"]) if r["measured_bytes"] else r["outcome"],
                f"{format_bytes(r['predicted_bytes'])} ({format_bytes(r['low_bytes'])}-"
                f"{format_bytes(r['high_bytes'])})",
                f"{r['error']:+.0%}" if r["error"] is not None else "",
            ]
            for r in rows
        ],
    )
    errors = [r["error"] for r in rows if r["error"] is not None]
    if errors:
        band = f"error {min(errors):+.0%} to {max(errors):+.0%}"
        out += f"\n\n{len(errors)} runs on {result['device']}, {result['date']}: {band}"
    return out


if __name__ == "__main__":
    main()
