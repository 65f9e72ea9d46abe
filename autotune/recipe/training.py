"""The training side of a recipe: its DataLoader over a user's dataset, shaped for the user's
model (its context, its label convention) and shared among the ranks of a recipe of several;
the gradient sync of accumulation over ranks; and the device kind its autocast and scaler use.
Imported by the Recipe methods that need torch, when called."""

from __future__ import annotations

import contextlib
import logging
import warnings
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
import torch

from autotune import registry
from autotune.config import IGNORE_INDEX, TrainConfig
from autotune.data.batching import PAD_TOKEN_ID, build_dataloader, default_bucket, padded_width
from autotune.errors import RecipeEnvironmentWarning, UsageError
from autotune.model.contract import ALIGNED, LABEL_CONVENTIONS, UNSHIFTED, batch_keys, label_convention_of
from autotune.model.introspect import context_length_of

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

log = logging.getLogger(__name__)

MIN_TOKENS = 2  # one input and its target: a shorter document has nothing to learn


def recipe_dataloader(
    cfg: TrainConfig,
    dataset: Any,
    *,
    for_model: torch.nn.Module | None = None,
    labels: str | None = None,
    seq_len: int | None = None,
    collate_fn: Callable[[list[torch.Tensor]], Any] | None = None,
    attention_mask: bool = False,
    seed: int = 0,
    world_size: int = 1,
) -> DataLoader:
    """See `Recipe.dataloader`. `world_size`: the recipe's ranks, which share every epoch's
    batches (`data.ranks.RankBatches`)."""
    for_model = unwrapped(for_model)
    convention = _label_convention(for_model, labels)
    _check_document_mask(cfg, for_model, convention)
    lengths = item_lengths(dataset)
    keep = np.flatnonzero(lengths >= MIN_TOKENS)
    if len(lengths) and len(keep) < len(lengths):
        log.warning(
            "recipe.dataloader: skipped %d of %d documents shorter than %d tokens (nothing to predict)",
            len(lengths) - len(keep),
            len(lengths),
            MIN_TOKENS,
        )
    if len(lengths) == 0:
        raise UsageError("dataset is empty")
    if len(keep) == 0:
        raise UsageError(f"dataset: no document has at least {MIN_TOKENS} tokens (an input and its target)")
    total, lengths = len(lengths), lengths[keep]
    seq_len = _seq_len(seq_len, for_model, lengths, convention)
    check_lengths(lengths, seq_len, convention, from_model=for_model is not None, indices=keep)
    if cfg.pin_memory and not torch.cuda.is_available():
        warnings.warn(
            "recipe: pin_memory dropped, there is no CUDA device to copy to", RecipeEnvironmentWarning, stacklevel=3
        )
        cfg = cfg.replace(pin_memory=False)
    # autotune's samplers plan aligned items (n tokens -> n - 1 inputs). An unshifted item's
    # inputs are all its n tokens, so it is planned as n + 1 tokens: the same width, padding and budget.
    planned = lengths + 1 if convention == UNSHIFTED else lengths
    if collate_fn is None and (for_model is not None or labels is not None):
        keys = batch_keys(for_model) if for_model is not None else ("input_ids", "labels")
        collate_fn = KeywordCollate(
            seq_len,
            default_bucket(seq_len),
            convention=convention,
            pad_to_full=cfg.batching == "fixed",
            window=cfg.batching == "packed",
            keys=keys,
            attention_mask=attention_mask,
        )
    return build_dataloader(
        TokenSequences(dataset, planned, indices=keep if len(keep) < total else None),
        cfg,
        seq_len=int(seq_len),
        seed=seed,
        collate_fn=collate_fn,
        whole_data=True,  # an epoch of training is every token of the data set, not a measurement's sample
        world_size=world_size,
    )


def unwrapped(model: torch.nn.Module | None) -> torch.nn.Module | None:
    """The model a DistributedDataParallel wrapper holds (its context, its labels and its forward's
    arguments are that model's); any other model as it is (FSDP2 shards in place)."""
    from autotune.knobs.parallel import is_ddp

    return model.module if model is not None and is_ddp(model) else model


def check_ranks(world_size: int, parallelism: str, method: str) -> None:
    """A recipe of `world_size` ranks runs in a process group of that many (torchrun): else
    UsageError, one line saying how to launch it."""
    from autotune.data.ranks import group_rank

    group_rank(world_size, f"{method}: the recipe trains on {world_size} ranks (parallelism={parallelism})")


def gradient_sync(model: torch.nn.Module, last: bool) -> contextlib.AbstractContextManager[None]:
    """What a micro-batch's forward and backward run under: gradients are communicated among the
    ranks only when `last` (the micro-batch that completes an optimizer step). DDP: its
    `no_sync()` otherwise (the forward must be inside too: DDP prepares the reduction there).
    FSDP2: `set_requires_gradient_sync(last)`, set on every call (the gradients of the
    micro-batches before the last are kept unsharded and summed locally, and the last backward
    reduce-scatters the sum). Any other model: nothing to skip."""
    from autotune.knobs.parallel import is_ddp, is_fsdp2

    if is_ddp(model):
        return contextlib.nullcontext() if last else model.no_sync()
    if is_fsdp2(model):
        model.set_requires_gradient_sync(last)  # type: ignore[operator]  # FSDPModule's, recursing into its blocks
    return contextlib.nullcontext()


def _check_document_mask(cfg: TrainConfig, model: torch.nn.Module | None, convention: str) -> None:
    """attention_mask=document batches carry `document_ids` for a forward that takes them
    (autotune's GPT), with aligned labels; the rule's own words when the model takes none."""
    if cfg.attention_mask != "document":
        return
    rule = registry.knob("attention_mask").model_rule
    why = rule(model, cfg.to_dict()) if model is not None and rule is not None else None
    if why is None and convention != ALIGNED:
        why = "document needs aligned labels (a model that shifts its labels takes no document_ids)"
    if why is not None:
        raise UsageError(f"recipe.dataloader: attention_mask={why}")


def _label_convention(for_model: torch.nn.Module | None, labels: str | None) -> str:
    if labels is not None and labels not in LABEL_CONVENTIONS:
        raise UsageError(f"labels must be one of {', '.join(LABEL_CONVENTIONS)}, got {labels!r}")
    if for_model is None:
        return labels or ALIGNED
    convention = label_convention_of(for_model)
    if labels is not None and labels != convention:
        raise UsageError(
            f"labels={labels!r}, but {type(for_model).__name__} expects {convention} labels "
            f"({'it shifts them inside its loss' if convention == UNSHIFTED else 'label t is the target of t'}); "
            "leave labels out and for_model decides"
        )
    return convention


def _seq_len(seq_len: int | None, model: torch.nn.Module | None, lengths: np.ndarray, convention: str) -> int:
    """The widest input: `seq_len`, else the model's context, else the longest document.
    Never the recipe's: the tuned model's context says nothing of this one."""
    context = context_length_of(model) if model is not None else None
    if seq_len is not None:
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
            raise UsageError(f"seq_len must be a positive integer, got {seq_len!r}")
        if context is not None and seq_len > context:
            raise UsageError(f"seq_len {seq_len} is longer than the model's context {context}")
        return seq_len
    if context is not None:
        return context
    if model is not None:
        raise UsageError(f"{type(model).__name__} does not say its context length: pass seq_len=")
    longest = int(lengths.max()) - (1 if convention == ALIGNED else 0)
    log.info("recipe.dataloader: seq_len %d, from the longest document (pass seq_len= or for_model=)", longest)
    return longest


class TokenSequences:
    """A user's dataset as autotune's loader reads it: items as 1-D int64 tensors, `lengths`
    for planning batches, and `indices` of the items kept (documents too short to train on
    are left out). Top-level, holding only the dataset and arrays, so DataLoader workers can
    pickle it (the user's dataset must be picklable too)."""

    def __init__(self, dataset: Any, lengths: np.ndarray, indices: np.ndarray | None = None) -> None:
        self.dataset = dataset
        self.lengths = lengths
        self.indices = indices

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> torch.Tensor:
        index = int(self.indices[i]) if self.indices is not None else i
        item = torch.as_tensor(self.dataset[index], dtype=torch.long)
        if item.dim() != 1:
            raise UsageError(
                f"dataset item {index} has shape {tuple(item.shape)}; expected one sequence of token ids (1-D)"
            )
        return item


class KeywordCollate:
    """Items -> a dict of the model's keyword arguments, right-padded: inputs with
    PAD_TOKEN_ID, labels with -100 (and `attention_mask` 1/0 on request).

    aligned:   {inputs: x[:-1], labels: x[1:]}, width the longest input rounded up to the bucket
    unshifted: {inputs: x, labels: x}, as Hugging Face models take them (they shift inside
               their loss); width the longest item rounded up to the bucket.
    Packed windows hold seq_len + 1 tokens (consecutive windows share one); unshifted, each
    keeps its first seq_len, so the stream is cut into disjoint blocks as Hugging Face's
    run_clm does. Top-level and stateless, so DataLoader workers can pickle it."""

    def __init__(
        self,
        seq_len: int,
        bucket: int,
        *,
        convention: str,
        pad_to_full: bool = False,
        window: bool = False,
        keys: tuple[str, str] = ("input_ids", "labels"),
        attention_mask: bool = False,
    ) -> None:
        self.seq_len, self.bucket = seq_len, bucket
        self.convention, self.pad_to_full, self.window = convention, pad_to_full, window
        self.keys, self.attention_mask = keys, attention_mask

    def __call__(self, items: Sequence[Any]) -> dict[str, torch.Tensor]:
        documents = None
        if items and isinstance(items[0], tuple):  # packed (window, document_ids): attention_mask=document
            items, documents = [window for window, _ in items], [ids for _, ids in items]
        if self.convention == ALIGNED:
            pairs = [(item[:-1], item[1:]) for item in items]
        else:
            pairs = [(item[: self.seq_len], item[: self.seq_len]) if self.window else (item, item) for item in items]
        longest = max(len(inputs) for inputs, _ in pairs)
        if longest > self.seq_len:
            raise UsageError(f"an item of {longest} inputs exceeds seq_len {self.seq_len}")
        width = self.seq_len if self.pad_to_full else int(padded_width(longest, self.seq_len, self.bucket))
        input_ids = torch.full((len(items), width), PAD_TOKEN_ID, dtype=torch.long)
        labels = torch.full((len(items), width), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((len(items), width), dtype=torch.long)
        for row, (inputs, targets) in enumerate(pairs):
            input_ids[row, : len(inputs)] = inputs
            labels[row, : len(targets)] = targets
            mask[row, : len(inputs)] = 1
        batch = {self.keys[0]: input_ids, self.keys[1]: labels}
        if documents is not None:  # whole windows (never padded): each position's document, as inputs x[:-1]
            batch["document_ids"] = torch.stack([ids[:-1] for ids in documents])
        if self.attention_mask:
            batch["attention_mask"] = mask
        return batch


def item_lengths(dataset: Any) -> np.ndarray:
    if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        raise UsageError(f"dataset: expected a map-style dataset (len() and [i]), got {type(dataset).__name__}")
    given: Sequence[int] | None = getattr(dataset, "lengths", None)
    if given is not None:
        lengths = np.asarray(given, dtype=np.int64)
        if lengths.shape != (len(dataset),):
            raise UsageError(f"dataset.lengths has {lengths.size} entries for {len(dataset)} items")
        return lengths
    # No lengths: one pass over the data (documented in Recipe.dataloader).
    return np.fromiter((len(dataset[i]) for i in range(len(dataset))), dtype=np.int64, count=len(dataset))


def check_lengths(
    lengths: np.ndarray,
    seq_len: int,
    convention: str = ALIGNED,
    *,
    from_model: bool = False,
    indices: np.ndarray | None = None,
) -> None:
    """Every (kept) document fits the model: seq_len + 1 tokens aligned (inputs x[:-1]),
    seq_len unshifted (inputs x). `indices`: the dataset index of each length, for the message."""
    most = seq_len + 1 if convention == ALIGNED else seq_len
    long = np.flatnonzero(lengths > most)
    if len(long):
        source = "the model's context" if from_model else "seq_len"
        index = int(indices[long[0]]) if indices is not None else int(long[0])
        raise UsageError(
            f"dataset item {index} has {int(lengths[long[0]])} tokens, more than {source} {seq_len}"
            + (f" + 1 = {most}" if convention == ALIGNED else "")
            + f"; cut documents into pieces of at most {most} tokens"
        )


def device_kind(device_type: str | None) -> str:
    if device_type is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    return str(device_type).split(":", 1)[0]  # autocast takes "cuda", not "cuda:1"
