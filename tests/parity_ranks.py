"""k optimizer steps of gpt2-tiny (fp32) over a global batch, either as one rank of a torchrun
launch (`python -m torch.distributed.run --standalone --nproc-per-node N -m tests.parity_ranks
OUT CASES STEPS`), each rank taking its share of every global batch, or in one
process taking all of it (`reference`). Each records the parameters after the k steps and the
gradients each optimizer step applied, as full tensors (FSDP2's shards gathered): the parity
tests (tests/trial/test_parity.py) compare the two."""

from __future__ import annotations

import json
import sys

import torch

from autotune.config import TrainConfig
from autotune.knobs.apply import apply_model_knobs
from autotune.knobs.precision import grad_scaler
from autotune.measure.step import make_optimizer, make_train_step
from autotune.model.load import build_model

ROWS, WIDTH, VOCAB = 2, 64, 256  # a micro-batch: 2 full rows of 64 tokens, every label real


def micro_batches(steps: int, count: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """`count` micro-batches for each of `steps` global batches, the same wherever it is made."""
    g = torch.Generator().manual_seed(1234)
    out = []
    for _ in range(steps):
        batch = []
        for _ in range(count):
            x = torch.randint(0, VOCAB, (ROWS, WIDTH + 1), generator=g)
            batch.append((x[:, :-1].contiguous(), x[:, 1:].contiguous()))
        out.append(batch)
    return out


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def train(cfg: TrainConfig, steps: int, accumulation: int, rank: int, world: int) -> dict:
    torch.manual_seed(0)
    model = apply_model_knobs(build_model("gpt2-tiny"), cfg, world_size=world)
    inner = getattr(model, "module", model)
    optimizer = make_optimizer(model, cfg)
    grads: list[list[torch.Tensor]] = []
    stepping = optimizer.step

    def step_and_note(*args, **kwargs):
        grads.append([_full(p.grad) for p in inner.parameters()])
        return stepping(*args, **kwargs)

    optimizer.step = step_and_note
    step = make_train_step(
        model,
        optimizer,
        grad_scaler("cpu", cfg.amp_dtype),
        device=torch.device("cpu"),
        device_kind="cpu",
        cfg=cfg,
        accumulation_steps=accumulation,
    )
    for batch in micro_batches(steps, accumulation * world):
        for x, y in batch[rank * accumulation : (rank + 1) * accumulation]:  # this rank's share
            step(x, y)
    return {"params": [_full(p) for p in inner.parameters()], "grads": grads}


def reference(steps: int, global_micro_batches: int) -> dict:
    """One process, no parallelism, every micro-batch of each global batch."""
    return train(TrainConfig(), steps, global_micro_batches, 0, 1)


def main(argv: list[str]) -> None:
    """CASES: a JSON list of [config, accumulation] pairs, each trained from the same start in one
    launch (one rendezvous for all: a launch costs seconds); rank 0 saves their results, in order."""
    import torch.distributed as dist

    out, cases, steps = argv[0], json.loads(argv[1]), int(argv[2])
    dist.init_process_group("gloo")
    results = []
    for config, accumulation in cases:
        try:
            results.append(
                train(TrainConfig.from_dict(config), steps, accumulation, dist.get_rank(), dist.get_world_size())
            )
        except Exception as exc:  # noqa: BLE001 - the test says which case failed, and how
            results.append({"error": f"{type(exc).__name__}: {exc}"})
    if dist.get_rank() == 0:
        torch.save(results, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
