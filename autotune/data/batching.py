"""Batches: the samplers that plan them (length-grouped by token budget, or fixed), the
collate that pads them, and `build_dataloader`, the one place the DataLoader knobs apply.

Batching modes (`TrainConfig.batching`):
  fixed   token_budget // seq_len random sequences, each padded to seq_len (the untuned baseline)
  padded  length-grouped batches of at most token_budget tokens, padding included
  packed  documents concatenated and cut into windows of seq_len + 1 tokens: no padding

Batches are (input_ids, labels); packed batches under attention_mask=document are
(input_ids, labels, document_ids), the third (B, T) int32 saying which document each
position belongs to, for the model's `document_ids` argument.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from autotune import registry
from autotune.config import IGNORE_INDEX, TrainConfig, check_int
from autotune.data.datasets import TokenDataset
from autotune.data.packing import PACKED_MAX_TOKENS, PackedDataset
from autotune.data.ranks import RankBatches
from autotune.errors import AutotuneError, UsageError

PAD_TOKEN_ID = 0  # input id at pad positions (their labels are IGNORE_INDEX, so it is never learned)


def default_bucket(seq_len: int) -> int:
    """Padded widths are rounded up to a multiple of this, so torch.compile sees a few
    distinct shapes rather than one per batch."""
    return 64 if seq_len >= 256 else 16


def padded_width(input_len: np.ndarray | int, seq_len: int, bucket: int) -> np.ndarray:
    """Width a batch is padded to when its longest input has `input_len` tokens: rounded up
    to the bucket, capped at seq_len (elementwise for arrays)."""
    return np.minimum(-(-np.maximum(input_len, 1) // bucket) * bucket, seq_len)


def check_token_budget(token_budget: int, seq_len: int) -> None:
    if token_budget < seq_len:
        raise UsageError(
            f"token_budget {token_budget} is smaller than the context length {seq_len}: "
            "one full-length sequence must fit in a step"
        )


class _EpochBatchSampler(Sampler[list[int]]):
    """Each iter() is the next epoch, with its own seeded order: epochs differ, and the
    same seed replays the same sequence of epochs."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        # Planned eagerly, so the epoch is fixed when iter() is called, not at first next().
        batches = self.batches(self.epoch)
        self.epoch += 1
        return iter(batches)

    def _rng(self, epoch: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, epoch])

    def batches(self, epoch: int) -> list[list[int]]:
        raise NotImplementedError


class TokenBudgetBatchSampler(_EpochBatchSampler):
    """Length-grouped batches: width * batch size <= token_budget, width being the batch's
    longest input rounded up to the bucket.

    Each epoch: shuffle, sort widest first (stable, so equal widths stay shuffled), cut
    greedily, shuffle the batches. Widest first, every batch but the last (the shortest
    leftovers) holds token_budget // width sequences: its shape is a function of its width,
    so there are few distinct shapes. The last batch is kept: dropping it would drop the
    same shortest documents every epoch. Sorting by width rather than exact length pads
    the same and mixes each width class anew every epoch."""

    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray,
        token_budget: int,
        seq_len: int,
        seed: int = 0,
        *,
        bucket: int | None = None,
    ) -> None:
        super().__init__(seed)
        check_token_budget(token_budget, seq_len)
        bucket = bucket or default_bucket(seq_len)
        self.widths = padded_width(np.asarray(lengths, dtype=np.int64) - 1, seq_len, bucket)
        self.token_budget = token_budget
        # Cuts depend only on the sorted widths, the same every epoch: so is the length.
        self._len = len(_greedy_batches(np.argsort(-self.widths, kind="stable"), self.widths, token_budget))

    def __len__(self) -> int:
        return self._len

    def batches(self, epoch: int) -> list[list[int]]:
        rng = self._rng(epoch)
        order = rng.permutation(len(self.widths))
        widest_first = order[np.argsort(-self.widths[order], kind="stable")]
        batches = _greedy_batches(widest_first, self.widths, self.token_budget)
        return [batches[k] for k in rng.permutation(len(batches))]


class FixedBatchSampler(_EpochBatchSampler):
    """`batch_size` random items per batch (a fresh seeded shuffle each epoch). `drop_last`:
    the items left over make no batch (one batch shape, as a measurement wants); without it
    they make a smaller last one, so an epoch trains on every item."""

    def __init__(self, num_items: int, batch_size: int, seed: int = 0, *, drop_last: bool = True) -> None:
        super().__init__(seed)
        self.num_items = num_items
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __len__(self) -> int:
        whole, rest = divmod(self.num_items, self.batch_size)
        return whole + (1 if rest and not self.drop_last else 0)

    def batches(self, epoch: int) -> list[list[int]]:
        order = self._rng(epoch).permutation(self.num_items)
        size = self.batch_size
        return [order[k : k + size].tolist() for k in range(0, min(len(self) * size, self.num_items), size)]


def _greedy_batches(order: np.ndarray, widths: np.ndarray, token_budget: int) -> list[list[int]]:
    """Cut `order` into consecutive batches, each as large as (widest width) * size <= token_budget allows."""
    batches: list[list[int]] = []
    current: list[int] = []
    width = 0
    for index, item_width in zip(order.tolist(), widths[order].tolist()):
        grown = max(width, item_width)
        if current and grown * (len(current) + 1) > token_budget:
            batches.append(current)
            current, grown = [], item_width
        current.append(index)
        width = grown
    if current:
        batches.append(current)
    return batches


class PadCollate:
    """Items -> (input_ids, labels), (B, width) int64, right-padded: inputs with
    PAD_TOKEN_ID, labels with IGNORE_INDEX. Width: seq_len when `pad_to_full`, else the
    longest input rounded up to the bucket. Top-level and stateless, so workers can pickle it."""

    def __init__(self, seq_len: int, bucket: int, pad_to_full: bool = False) -> None:
        self.seq_len = seq_len
        self.bucket = bucket
        self.pad_to_full = pad_to_full

    def __call__(self, items: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        longest = max(len(item) for item in items) - 1
        if longest > self.seq_len:
            raise AutotuneError(f"an item of {longest + 1} tokens exceeds seq_len + 1 = {self.seq_len + 1}")
        width = self.seq_len if self.pad_to_full else int(padded_width(longest, self.seq_len, self.bucket))
        input_ids = torch.full((len(items), width), PAD_TOKEN_ID, dtype=torch.long)
        labels = torch.full((len(items), width), IGNORE_INDEX, dtype=torch.long)
        for row, item in enumerate(items):
            size = len(item) - 1
            input_ids[row, :size] = item[:-1]
            labels[row, :size] = item[1:]
        return input_ids, labels


class DocumentCollate:
    """Packed (window, document_ids) items -> (input_ids, labels, document_ids), each
    (B, seq_len): inputs and their document ids are window[:-1], labels window[1:]. A
    label may start the next document (nanoGPT's streams do the same after each EOT); what
    the document mask changes is what each position attends to."""

    def __call__(self, items: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, ...]:
        windows = torch.stack([window for window, _ in items])
        documents = torch.stack([docs for _, docs in items])
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous(), documents[:, :-1].contiguous()


def build_dataloader(
    dataset: TokenDataset,
    cfg: TrainConfig,
    *,
    seq_len: int,
    seed: int = 0,
    collate_fn: Callable[[list[torch.Tensor]], Any] | None = None,
    whole_data: bool = False,
    world_size: int = 1,
) -> DataLoader:
    """The loader of (input_ids, labels) batches for `cfg.batching`, and the loader stage: each
    knob's registry `loader` mapping gives its DataLoader keywords (num_workers, prefetch_factor, ...).
    A user `collate_fn` replaces ours and receives the list of 1-D token tensors (packed
    with attention_mask=document: of (window, document_ids) pairs).

    `whole_data`: training's epochs, every token of the data set: packed batching packs all
    of it (a measurement packs at most PACKED_MAX_TOKENS, thousands of windows, enough to time
    a step) and fixed or packed rows left over at the end of an epoch make one smaller batch
    (a measurement drops them: one batch shape).

    `world_size`: the ranks of one launch that share the batches, each taking its share of every
    epoch (`data.ranks.RankBatches`: the rank is the process group's when first iterated)."""
    check_int("seed", seed, minimum=0)
    check_token_budget(cfg.token_budget, seq_len)
    bucket = default_bucket(seq_len)
    sampler: _EpochBatchSampler
    documents = cfg.attention_mask == "document"  # TrainConfig allows it with packed only
    if cfg.batching == "padded":
        sampler = TokenBudgetBatchSampler(dataset.lengths, cfg.token_budget, seq_len, seed, bucket=bucket)
    else:
        if cfg.batching == "packed":
            dataset = PackedDataset(
                dataset,
                seq_len=seq_len,
                seed=seed,
                max_tokens=None if whole_data else PACKED_MAX_TOKENS,
                with_documents=documents,
            )
        sampler = FixedBatchSampler(len(dataset), cfg.token_budget // seq_len, seed, drop_last=not whole_data)
        if len(sampler) == 0:
            raise UsageError(
                f"token_budget {cfg.token_budget}: {cfg.batching} batching needs {sampler.batch_size} "
                f"sequences of {seq_len} per step, the data gives only {len(dataset)}"
            )
    # The sampler plans each batch: the DataLoader's batch_size stays its 1 (token_budget's mapping).
    view, knobs = SimpleNamespace(cfg=cfg, sequences_per_step=1), {}
    for knob in (k for k in registry.knobs_of() if k.loader is not None):
        knobs.update(knob.loader(getattr(cfg, knob.name), view))
    return DataLoader(
        dataset,  # type: ignore[arg-type]  # map-style by protocol, not by Dataset subclass
        batch_sampler=sampler if world_size == 1 else RankBatches(sampler, world_size),
        **knobs,
        collate_fn=collate_fn
        or (DocumentCollate() if documents else PadCollate(seq_len, bucket, pad_to_full=cfg.batching != "padded")),
        generator=torch.Generator().manual_seed(seed),  # seeds the workers' RNGs reproducibly
    )


def distinct_batch_shapes(loader: DataLoader) -> list[tuple[int, int]] | None:
    """Every (batch size, width) the loader's batches take, widest first: the same set every
    epoch (length-grouped cuts depend only on the sorted widths; fixed and packed batches
    have one shape). None when the loader is not one `build_dataloader` made with our collate."""
    sampler, collate = getattr(loader, "batch_sampler", None), getattr(loader, "collate_fn", None)
    if isinstance(collate, DocumentCollate) and isinstance(sampler, FixedBatchSampler):
        return [(sampler.batch_size, loader.dataset.seq_len)]  # packed windows with their documents
    if not isinstance(collate, PadCollate):
        return None
    if isinstance(sampler, TokenBudgetBatchSampler):
        order = np.argsort(-sampler.widths, kind="stable")
        cuts = _greedy_batches(order, sampler.widths, sampler.token_budget)
        shapes = {(len(batch), int(sampler.widths[batch].max())) for batch in cuts}
    elif isinstance(sampler, FixedBatchSampler) and collate.pad_to_full:
        shapes = {(sampler.batch_size, collate.seq_len)}
    else:
        return None
    return sorted(shapes, key=lambda shape: (-shape[1], -shape[0]))


def carries_document_ids(loader: DataLoader) -> bool:
    """Whether the loader's batches are (input_ids, labels, document_ids): packed windows under
    attention_mask=document. Warm-up batches must then carry document ids too, or they would
    warm the plain causal graph and not the document-masked one."""
    return isinstance(getattr(loader, "collate_fn", None), DocumentCollate)


# ------------------------------------------------------------------------ padding figures


def padding_fraction(batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Pad positions / all positions over (input_ids, labels) batches (pads: labels == IGNORE_INDEX)."""
    pad = total = 0
    for _, labels in batches:
        pad += int((labels == IGNORE_INDEX).sum())
        total += labels.numel()
    return pad / total if total else 0.0
