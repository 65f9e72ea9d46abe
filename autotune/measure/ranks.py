"""What the measuring loop agrees on across the ranks of one launch (`trial.ranks`).

Each rank runs the same loop (`measure.loop`) on its own device and its own shard of the data.
Every collective the training step makes (DDP's all-reduce, FSDP2's all-gather and
reduce-scatter) must be made by every rank, so every decision that sets how many steps a rank
takes is made together: whether a warm-up pass was quiet, whether a window had a compile in it
and is timed again, whether it was noisy and takes a second one, and when the window has lasted
its minimum time (each rank reads its own clock). A window starts after a barrier, so the ranks
start it together, and each rank's clock stops at its own last step; a barrier after it keeps a
fast rank from starting what follows early. The figures are each rank's own: `trial.ranks`
aggregates them (every rank's tokens over the slowest rank's window).

Alone (no process group, or one rank) every call is what one process would decide: no
collective, nothing changed."""

from __future__ import annotations

import torch


class Ranks:
    """The ranks of the initialised process group, or one process alone."""

    def __init__(self, device: torch.device) -> None:
        import torch.distributed as dist

        joined = dist.is_available() and dist.is_initialized()
        self.world = dist.get_world_size() if joined else 1
        self.rank = dist.get_rank() if joined else 0
        self.device = device  # where a collective's tensor lives (NCCL's are on the GPU)

    @property
    def alone(self) -> bool:
        return self.world == 1

    def barrier(self) -> None:
        if not self.alone:
            import torch.distributed as dist

            dist.barrier()

    def any(self, flag: bool) -> bool:
        """True when `flag` is true on any rank."""
        return flag if self.alone else self._reduce(float(flag), "max") > 0

    def all(self, flag: bool) -> bool:
        """True when `flag` is true on every rank."""
        return flag if self.alone else self._reduce(float(flag), "min") > 0

    def _reduce(self, value: float, how: str) -> float:
        import torch.distributed as dist

        tensor = torch.tensor([value], dtype=torch.float32, device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX if how == "max" else dist.ReduceOp.MIN)
        return float(tensor.item())
