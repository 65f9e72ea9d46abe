"""Batches shared among the ranks of one launch (torchrun --nproc-per-node N): each rank takes
its own share of every epoch's batches, as `DistributedSampler` shares samples.

Every rank plans the same epoch (the batch samplers are seeded, so the same seed gives the same
batches everywhere), pads it by repeating its first batches up to a multiple of N, as
DistributedSampler pads (every document is seen, and every rank takes the same number of
micro-steps: a rank with one more would wait forever in its gradient all-reduce), then rank r
takes batches r, r + N, r + 2N, ... Token-budget batching stays what it is: the batches are
planned over the whole data set, then dealt out whole."""

from __future__ import annotations

import itertools
from typing import Iterator

from torch.utils.data import Sampler

from autotune.errors import UsageError


class RankBatches(Sampler[list[int]]):
    """Rank `rank`'s share of `batches` (a batch sampler) among `world_size` ranks. `rank`
    None: the rank of the process group initialised when the batches are first asked for (a
    DataLoader made before `init_process_group`, as Lightning's strategies make them, still
    shares); its world size must be `world_size`."""

    def __init__(self, batches: Sampler[list[int]], world_size: int, rank: int | None = None) -> None:
        super().__init__()
        if rank is not None and not 0 <= rank < world_size:
            raise UsageError(f"rank {rank} is not one of the {world_size} ranks (0 to {world_size - 1})")
        self.batches = batches  # every rank's: the whole epoch
        self.world_size = world_size
        self.rank = rank

    def set_epoch(self, epoch: int) -> None:
        set_epoch = getattr(self.batches, "set_epoch", None)
        if set_epoch is not None:
            set_epoch(epoch)

    def __len__(self) -> int:
        return -(-len(self.batches) // self.world_size)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[list[int]]:
        if self.rank is not None:
            rank = self.rank
        else:
            rank = group_rank(self.world_size, f"the data loader's batches are shared among {self.world_size} ranks")
        epoch = list(self.batches)  # the same on every rank: the samplers are seeded
        padded = list(itertools.islice(itertools.cycle(epoch), len(self) * self.world_size)) if epoch else []
        return iter(padded[rank :: self.world_size])


def group_rank(world_size: int, about: str) -> int:
    """This process's rank in the initialised default process group, whose world size must be
    `world_size`; else UsageError, one line: `about` (what needs them), then what is wrong and
    how to launch."""
    import torch.distributed as dist

    launch = f"launch with torchrun --nproc-per-node {world_size}"
    if not (dist.is_available() and dist.is_initialized()):
        raise UsageError(
            f"{about}, but no process group is initialised: {launch} and call "
            "torch.distributed.init_process_group() first"
        )
    if dist.get_world_size() != world_size:
        raise UsageError(f"{about}, but the process group has {dist.get_world_size()}: {launch}")
    return dist.get_rank()
