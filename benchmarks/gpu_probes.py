"""Two probes for the first GPU run (benchmarks/gpu_check.sh), each a few seconds, as one JSON:

- **fp16 + chunked loss**: the head's gradients under float16 autocast and a GradScaler's
  scale (2**16, its default start), from the standard and the chunked loss
  (`autotune.model.loss`), against float32. A gradient that is cast to float16 before the scale
  applies flushes to zero (p / n_tokens is far below float16's least subnormal, 6e-8, at a
  vocabulary of 50304): the figure to read is `weight_grad_zero_fraction`, with the relative
  error of each gradient against float32.
- **fork server**: a trial started the way a search starts it (`trial.runner.run_trial`, forked
  from `trial.fork_server`), on this device: that it measures `ok`, that it was forked from the
  server, that the server never started CUDA (it holds no open `/dev/nvidia-uvm`, which `cuInit`
  opens: a fork after CUDA's start breaks in the child), and what starting it cost (spawn to
  ready).

    python benchmarks/gpu_probes.py --device cuda:0 [--tokens 32768]
    python benchmarks/gpu_probes.py --device cpu --tokens 256 --width 32    # the dry run's
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import _common  # noqa: F401  (the checkout on sys.path)

SCALE = 2.0**16  # torch.amp.GradScaler's initial scale
VOCAB, WIDTH = 50304, 768  # GPT-2 124M's head
AGREE = 1e-2  # a gradient within 1 % of float32's (relative L2) agrees


def fp16_chunked(device: str, tokens: int, width: int = WIDTH) -> dict[str, Any]:
    import torch

    from autotune.model.loss import chunked_linear_cross_entropy, standard_linear_cross_entropy

    dev = torch.device(device)
    gen = torch.Generator(device="cpu").manual_seed(0)
    hidden = torch.randn(tokens, width, generator=gen).to(dev)
    weight = (0.02 * torch.randn(VOCAB, width, generator=gen)).to(dev)
    labels = torch.randint(VOCAB, (tokens,), generator=gen).to(dev)

    def grads(loss_fn, dtype) -> tuple[Any, Any]:
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        with torch.autocast(dev.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = loss_fn(h, w, labels)
        (loss.float() * SCALE).backward()  # what GradScaler.scale(loss).backward() does
        return h.grad.float() / SCALE, w.grad.float() / SCALE

    def rel(a, b) -> float:
        return float((a - b).norm() / b.norm().clamp(min=1e-30))

    ref_h, ref_w = grads(standard_linear_cross_entropy, None)
    out: dict[str, Any] = {"tokens": tokens, "vocab": VOCAB, "width": width, "loss_scale": SCALE}
    for name, fn in (("standard", standard_linear_cross_entropy), ("chunked", chunked_linear_cross_entropy)):
        g_h, g_w = grads(fn, torch.float16)
        errors = (rel(g_w, ref_w), rel(g_h, ref_h))
        out[name] = {
            "weight_grad_zero_fraction": float((g_w == 0).float().mean()),
            "weight_grad_rel_error": errors[0],
            "hidden_grad_rel_error": errors[1],
            "agrees": all(math.isfinite(e) and e <= AGREE for e in errors),
        }
    return out


CUDA_STARTED_MARK = "/dev/nvidia-uvm"  # what cuInit opens, and nothing before it does


def started_cuda(pid: int, mark: str = CUDA_STARTED_MARK) -> bool | None:
    """Whether the process has started CUDA: it holds `mark` open (cuInit opens the unified
    memory device); None if its descriptors are unreadable.

    Not "libcuda.so in /proc/PID/maps": `import torch` of a CUDA build maps the driver library
    without starting CUDA (libcublasLt and libcusparseLt load it; no cuInit, and
    torch.cuda.is_initialized() stays False), so that test cries wolf on every GPU host."""
    fds = Path(f"/proc/{pid}/fd")
    try:
        names = list(fds.iterdir())
    except OSError:
        return None
    for fd in names:
        try:
            if os.readlink(fd) == mark:
                return True
        except OSError:  # closed since the listing
            continue
    return False


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def fork_server_trial(device: str) -> dict[str, Any]:
    from autotune.config import RunSpec, TrainConfig
    from autotune.trial import fork_server
    from autotune.trial.runner import run_trial

    seen: dict[str, Any] = {}

    def on_start(pid: int) -> None:
        seen["server"] = _parent(pid)

    spec = RunSpec(model="gpt2-tiny", device=device, warmup=1, steps=5, min_time_s=0.0)
    started = time.perf_counter()
    result = run_trial(spec, TrainConfig(token_budget=2048, batching="packed"), timeout_s=120, on_start=on_start)
    server = seen.get("server")
    forked = fork_server.fork_enabled() and server is not None and server != os.getpid()
    server_cuda = started_cuda(server) if forked else None
    return {
        "outcome": result.outcome,
        "reason": result.reason,
        "forked": forked,
        "server_pid": server if forked else None,
        "server_started_cuda": server_cuda,
        "spawn_to_ready_s": result.phase_s.get("spawn_to_ready"),
        "wall_s": round(time.perf_counter() - started, 2),
        "ok": result.outcome == "ok" and forked and server_cuda is False,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--tokens", type=int, default=32768, help="tokens in the fp16 + chunked loss probe")
    # The flush to zero depends on the vocabulary and the tokens, not the width: a CPU (which
    # emulates float16 matmuls) probes a narrow head.
    parser.add_argument("--width", type=int, default=WIDTH, help="the head's input width")
    args = parser.parse_args()
    report: dict[str, Any] = {"device": args.device}
    for name, probe in (
        ("fp16_chunked", lambda: fp16_chunked(args.device, args.tokens, args.width)),
        ("fork_server", lambda: fork_server_trial(args.device)),
    ):
        try:
            report[name] = probe()
        except Exception as exc:  # noqa: BLE001 - a probe that breaks is a finding, reported as such
            report[name] = {"error": f"{type(exc).__name__}: {exc}"}
    json.dump(report, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
