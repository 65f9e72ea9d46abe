"""Memory of the head's loss per token, for each loss_impl: what a step holds for the
(tokens x vocab) logits, at GPT-2's width 768 and vocabulary 50304, on this CPU.

    python benchmarks/loss_memory.py [--json] [--tokens 1024 2048 4096] [--dtype float32 bfloat16]

For each implementation, dtype and token count, one fresh process runs the head's forward
and backward (hidden states (N, 768) -> lm_head -> cross-entropy) and reports:
- saved: bytes of the tensors autograd keeps from forward for backward (distinct storages);
- largest: bytes of the largest tensor any operator made, forward and backward;
- peak: the process's peak resident memory during the step above what it held before
  (glibc returns freed large blocks to the OS, so this is the step's high-water mark).
Per token figures are slopes between the smallest and the largest token count, so fixed
costs (the 50304 x 768 weight and its gradient) drop out. bfloat16 runs under CPU autocast,
as a GPU step under bf16 autocast (matmuls in bf16, the softmax in fp32), on fake tensors
(shapes and dtypes, no data: this CPU has no bf16 matmul units and takes minutes per step),
so it has saved and largest but no peak."""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys

import _common  # noqa: F401
from _common import md_table

WIDTH, VOCAB = 768, 50304


def measure_one(impl: str, tokens: int, dtype: str, budget: int) -> dict:
    """Run in a fresh process (see main): one forward and backward of the head's loss."""
    import contextlib

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    from autotune.model.loss import chunked, standard_linear_cross_entropy

    fake = FakeTensorMode() if dtype == "bfloat16" else contextlib.nullcontext()
    torch.manual_seed(0)
    with fake:
        hidden = torch.randn(tokens, WIDTH, requires_grad=True)
        weight = (0.02 * torch.randn(VOCAB, WIDTH)).requires_grad_()
        labels = torch.randint(0, VOCAB, (tokens,))
    fn = standard_linear_cross_entropy if impl == "standard" else chunked(max_tokens=budget)
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = id(t.untyped_storage()) if dtype == "bfloat16" else t.untyped_storage().data_ptr()
        saved[key] = t.untyped_storage().nbytes()
        return t

    class Largest(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    Largest.largest = max(Largest.largest, t.numel() * t.element_size())
            return out

    before = _rss_bytes()
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16")
    with fake, Largest(), autocast, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = fn(hidden, weight, labels)
    with fake, Largest():
        loss.backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before if dtype == "float32" else None
    return {"saved": sum(saved.values()), "largest": Largest.largest, "peak": peak}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def run(token_counts: list[int], dtypes: list[str]) -> dict:
    rows = []
    for dtype in dtypes:
        for impl in ("standard", "chunked"):
            for tokens in token_counts:
                # The budget a run of this size would have: chunk count fixed by it.
                out = subprocess.run(
                    [sys.executable, __file__, "--one", impl, str(tokens), dtype, str(max(token_counts))],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                rows.append({"impl": impl, "dtype": dtype, "tokens": tokens, **json.loads(out.stdout)})
    per_token = {}
    for dtype in dtypes:
        for impl in ("standard", "chunked"):
            mine = [r for r in rows if r["impl"] == impl and r["dtype"] == dtype]
            lo, hi = mine[0], mine[-1]
            span = hi["tokens"] - lo["tokens"]
            per_token[f"{impl}/{dtype}"] = {
                k: (hi[k] - lo[k]) / span if span and hi[k] is not None else None for k in ("saved", "peak")
            }
    return {"width": WIDTH, "vocab": VOCAB, "rows": rows, "per_token_bytes": per_token}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[1024, 2048, 4096])
    p.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    p.add_argument("--json", action="store_true")
    p.add_argument("--one", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        impl, tokens, dtype, budget = args.one
        print(json.dumps(measure_one(impl, int(tokens), dtype, int(budget))))
        return
    result = run(sorted(args.tokens), args.dtype)
    if args.json:
        print(json.dumps(result, indent=2))
        return

    def mib(n: float | None) -> str:
        return "-" if n is None else f"{n / (1 << 20):.0f} MiB"

    def kib(n: float | None) -> str:
        return "-" if n is None else f"{n / 1024:.1f} KiB"

    print(
        md_table(
            ["loss_impl", "dtype", "tokens", "saved for backward", "largest tensor", "peak above start"],
            [
                [r["impl"], r["dtype"], r["tokens"], mib(r["saved"]), mib(r["largest"]), mib(r["peak"])]
                for r in result["rows"]
            ],
        )
    )
    print()
    print(
        md_table(
            ["per token", "saved for backward", "peak"],
            [[key, kib(v["saved"]), kib(v["peak"])] for key, v in result["per_token_bytes"].items()],
        )
    )


if __name__ == "__main__":
    main()
