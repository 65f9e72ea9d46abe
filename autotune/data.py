"""Training data for a measurement: datasets, tokenizer, batch samplers, collate, and the
one `build_dataloader` that applies the DataLoader knobs.

Every dataset is map-style. Item i is a 1-D int64 tensor of at most seq_len + 1 tokens (a
document, or a piece of a long one); the model reads inputs x[:-1] and labels x[1:].
`dataset.lengths[i]` says how many tokens item i has *before* it is loaded, so batches are
planned without reading data. A length may be an upper bound (GPT-2 BPE text is planned by
its byte count) but never an underestimate, so a planned batch never exceeds its budget.

Batching modes (`TrainConfig.batching`):
  fixed   token_budget // seq_len random sequences, each padded to seq_len (the untuned baseline)
  padded  length-grouped batches of at most token_budget tokens, padding included
  packed  documents concatenated and cut into windows of seq_len + 1 tokens: no padding
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import math
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Protocol, Sequence
from unittest import mock

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from autotune.config import TrainConfig
from autotune.errors import AutotuneError, UsageError
from autotune.models import IGNORE_INDEX

log = logging.getLogger(__name__)

EOT_TOKEN = 50256  # GPT-2 end-of-text; documents in .bin files are split at it
PAD_TOKEN_ID = 0  # input id at pad positions (their labels are IGNORE_INDEX, so it is never learned)
GPT2_VOCAB = 50257  # tokens of GPT-2's encoding, EOT_TOKEN being the last
BYTE_EOT = 256  # document end of the byte-level tokenizer, right after the 256 byte values
MIN_DOC_TOKENS = 8  # shortest synthetic document
# A packed stream is materialized; 4M tokens (16 MB as int32) is thousands of windows,
# more than one measurement uses, whatever the corpus size.
PACKED_MAX_TOKENS = 1 << 22
_BIN_SCAN_CHUNK = 1 << 24  # tokens read at once while indexing a .bin file


class TokenDataset(Protocol):
    """What samplers and collate need. `lengths[i]` may be an upper bound of len(self[i])."""

    lengths: Sequence[int]

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> torch.Tensor: ...


def default_min_tokens(seq_len: int) -> int:
    """Tokens of data made or read by default: hundreds of batches at a budget of
    8 * seq_len, so a measurement of ~50 steps stays within one epoch."""
    return 4096 * seq_len


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


# --------------------------------------------------------------------------- datasets


def make_dataset(
    data: str, *, vocab_size: int, seq_len: int, seed: int = 0, min_tokens: int | None = None
) -> TokenDataset:
    """`data` is "synthetic" or a path ending in .bin (nanoGPT uint16 tokens), .txt
    (documents separated by blank lines) or .jsonl (objects with a "text" field).

    min_tokens: synthetic data has at least this many tokens; a .bin file is indexed up to
    this many (a measurement needs millions of tokens, not a whole 9B-token corpus).
    Text files are read whole. Default: `default_min_tokens(seq_len)`."""
    _require_int("vocab_size", vocab_size, 2)
    _require_int("seq_len", seq_len, 2)
    _require_int("seed", seed, 0)
    min_tokens = default_min_tokens(seq_len) if min_tokens is None else min_tokens
    _require_int("min_tokens", min_tokens, 1)
    if data == "synthetic":
        return SyntheticDataset(vocab_size=vocab_size, seq_len=seq_len, seed=seed, min_tokens=min_tokens)
    path = Path(data)
    kind = path.suffix.lower()
    if kind not in (".bin", ".txt", ".jsonl"):
        raise UsageError(f"data {data!r}: expected synthetic or a file ending in .bin, .txt or .jsonl")
    if not path.is_file():
        raise UsageError(f"data file {data} {'is not a file' if path.exists() else 'not found'}")
    if kind == ".bin":
        return BinDataset(path, vocab_size=vocab_size, seq_len=seq_len, max_tokens=min_tokens)
    tokenizer = choose_tokenizer(vocab_size, where=str(path))
    documents = _txt_documents(path) if kind == ".txt" else _jsonl_documents(path)
    return TextDataset(documents, tokenizer=tokenizer, seq_len=seq_len, where=str(path))


class SyntheticDataset:
    """Documents of uniform random token ids with realistic lengths. Web-text document
    lengths are well described as log-normal (most documents short, a heavy tail of long
    ones), so lengths are log-normal with median seq_len / 4 and sigma 1, at least 8 tokens.
    Ids are drawn in __getitem__ from a per-item seed: memory stays flat however long the
    corpus, and DataLoader workers have some work to do."""

    def __init__(self, *, vocab_size: int, seq_len: int, seed: int, min_tokens: int) -> None:
        self.vocab_size = vocab_size
        self.seed = seed
        doc_lengths = _lognormal_lengths(np.random.default_rng(seed), median=seq_len / 4, min_tokens=min_tokens)
        self.lengths: np.ndarray = _split_spans(np.zeros_like(doc_lengths), doc_lengths, seq_len + 1)[1]

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> torch.Tensor:
        i = range(len(self))[i]  # IndexError past the end, as iteration expects
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        return torch.randint(1, self.vocab_size, (int(self.lengths[i]),), generator=generator)


def _lognormal_lengths(rng: np.random.Generator, *, median: float, min_tokens: int) -> np.ndarray:
    """Document lengths adding up to at least `min_tokens`, drawn in vectorized rounds."""
    mean = median * math.exp(0.5)  # mean of a log-normal with sigma 1: sizes each round
    rounds: list[np.ndarray] = []
    total = 0
    while total < min_tokens:
        count = int((min_tokens - total) / mean) + 16
        drawn = np.rint(rng.lognormal(math.log(median), 1.0, count))
        rounds.append(np.maximum(drawn, MIN_DOC_TOKENS).astype(np.int64))
        total += int(rounds[-1].sum())
    lengths = np.concatenate(rounds)
    return lengths[: int(np.searchsorted(np.cumsum(lengths), min_tokens)) + 1]


def _split_spans(starts: np.ndarray, lengths: np.ndarray, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Chunk documents (start, length) into pieces of `max_len` tokens plus the remainder,
    as a real pipeline chunks long documents; a remainder under 2 tokens has no label and
    is dropped. Returns the pieces' starts and lengths, vectorized."""
    full, rest = np.divmod(lengths, max_len)
    counts = full + (rest >= 2)
    doc = np.repeat(np.arange(len(lengths)), counts)
    nth = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)  # piece k of its doc
    offsets = nth * max_len
    return starts[doc] + offsets, np.minimum(max_len, lengths[doc] - offsets)


class BinDataset:
    """A nanoGPT-style flat file of uint16 token ids, split into documents at EOT_TOKEN (the
    EOT stays as the last token of its document, as in nanoGPT's streams)."""

    def __init__(self, path: Path, *, vocab_size: int, seq_len: int, max_tokens: int) -> None:
        size = path.stat().st_size
        if size == 0 or size % 2:
            raise UsageError(
                f"{path}: expected a flat file of uint16 token ids (nanoGPT .bin), "
                f"got {'an empty file' if size == 0 else f'an odd size of {size} bytes'}"
            )
        self.path = path
        self._tokens: np.memmap | None = None
        count = min(size // 2, max_tokens)
        ends, largest = _scan_bin(self.tokens, count)
        if largest >= vocab_size:
            raise UsageError(
                f"{path}: token id {largest} >= vocab_size {vocab_size} of this model; "
                "use a model with a larger vocabulary"
            )
        if len(ends) == 0 or ends[-1] != count:  # the last document may lack its EOT
            ends = np.append(ends, count)
        starts = np.concatenate(([0], ends[:-1]))
        self.starts, self.lengths = _split_spans(starts, ends - starts, seq_len + 1)
        if len(self.lengths) == 0:
            raise UsageError(f"{path}: no document of 2 or more tokens")

    @property
    def tokens(self) -> np.memmap:
        # Opened lazily in each process: a worker started by spawn gets the path, not a
        # pickled copy of the whole mapping.
        if self._tokens is None:
            self._tokens = np.memmap(self.path, dtype=np.uint16, mode="r")
        return self._tokens

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_tokens": None}

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> torch.Tensor:
        start = int(self.starts[i])
        return torch.from_numpy(self.tokens[start : start + int(self.lengths[i])].astype(np.int64))


def _scan_bin(tokens: np.ndarray, count: int) -> tuple[np.ndarray, int]:
    """Positions just after each EOT in tokens[:count], and the largest id there. Read in
    chunks, so a multi-GB file never needs a temporary of its size."""
    ends: list[np.ndarray] = [np.zeros(0, dtype=np.int64)]
    largest = 0
    for low in range(0, count, _BIN_SCAN_CHUNK):
        block = np.asarray(tokens[low : min(count, low + _BIN_SCAN_CHUNK)])
        largest = max(largest, int(block.max()))
        ends.append(np.flatnonzero(block == EOT_TOKEN) + low + 1)
    return np.concatenate(ends), largest


class TextDataset:
    """Text documents, tokenized in __getitem__ so DataLoader workers do real CPU work.

    Long documents are pre-split into pieces of at most seq_len + 1 length units, a unit
    being a UTF-8 byte or the document's end token. Byte-level, units are tokens, so
    `lengths` is exact; with GPT-2 BPE it is an upper bound (a token is at least one byte)."""

    def __init__(self, documents: Sequence[str], *, tokenizer: Tokenizer, seq_len: int, where: str) -> None:
        self.tokenizer = tokenizer
        self.documents = [text.encode("utf-8") for text in documents]
        with_eot = tokenizer.eot is not None
        pieces = [
            (doc, start, end, eot)
            for doc, data in enumerate(self.documents)
            for start, end, eot in _piece_bounds(data, seq_len + 1, with_eot)
        ]
        if not pieces:
            raise UsageError(f"{where}: no documents (expected text of at least 2 tokens)")
        self._pieces = np.array(pieces, dtype=np.int64)  # rows: document, byte start, byte end, ends with EOT
        self.lengths: np.ndarray = self._pieces[:, 2] - self._pieces[:, 1] + self._pieces[:, 3]

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> torch.Tensor:
        doc, start, end, eot = self._pieces[i].tolist()
        ids = self.tokenizer.encode(self.documents[doc][start:end])
        if eot:
            ids.append(self.tokenizer.eot)
        return torch.tensor(ids, dtype=torch.long)


def _piece_bounds(data: bytes, limit: int, with_eot: bool) -> list[tuple[int, int, bool]]:
    """(start, end, ends-with-EOT) byte ranges of one document, each of at most `limit`
    units. Cuts fall on UTF-8 character boundaries so every piece decodes on its own."""
    pieces = []
    start = 0
    while len(data) - start + with_eot > limit:
        cut = _utf8_boundary(data, start + limit, start)
        pieces.append((start, cut, False))
        start = cut
    if len(data) - start + with_eot >= 2:  # as for token chunks: a lone unit has no label
        pieces.append((start, len(data), with_eot))
    return pieces


def _utf8_boundary(data: bytes, cut: int, floor: int) -> int:
    """The last character boundary at or before `cut` (continuation bytes are 10xxxxxx);
    `cut` itself when no boundary lies after `floor` (a tiny limit)."""
    pos = cut
    while floor < pos < len(data) and data[pos] & 0xC0 == 0x80:
        pos -= 1
    return pos if pos > floor else cut


_BLANK_LINES = re.compile(r"\n\s*\n")  # one or more blank (or whitespace-only) lines


def _txt_documents(path: Path) -> list[str]:
    return [doc.strip() for doc in _BLANK_LINES.split(_read_text(path)) if doc.strip()]


def _jsonl_documents(path: Path) -> list[str]:
    documents = []
    # split("\n"), not splitlines(): JSON strings may hold raw U+2028 and similar breaks.
    for lineno, line in enumerate(_read_text(path).split("\n"), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(
                f"{path}:{lineno}: invalid JSON ({exc.msg}); expected an object with a \"text\" string"
            ) from None
        text = record.get("text") if isinstance(record, dict) else None
        if not isinstance(text, str):
            raise UsageError(f"{path}:{lineno}: expected a JSON object with a \"text\" string")
        documents.append(text)
    return documents


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


# -------------------------------------------------------------------------- tokenizers


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255; `eot` (256) ends a document when the vocabulary has room."""

    name = "byte-level"

    def __init__(self, eot: int | None) -> None:
        self.eot = eot

    def encode(self, data: bytes) -> list[int]:
        return list(data)


class GPT2Tokenizer:
    """tiktoken's GPT-2 encoding, loaded from its local cache in each process that uses it."""

    name = "tiktoken gpt2"
    eot: int | None = EOT_TOKEN

    def encode(self, data: bytes) -> list[int]:
        encoding = _gpt2_encoding()
        if encoding is None:
            raise AutotuneError("tiktoken's GPT-2 encoding is no longer loadable from its local cache")
        # A piece is cut mid-character only when its limit is under 4 bytes; drop such stray
        # bytes ('replace' would add tokens and break the bytes-bound on the length).
        return encoding.encode_ordinary(data.decode("utf-8", errors="ignore"))


Tokenizer = ByteTokenizer | GPT2Tokenizer

# tiktoken's GPT-2 files (tiktoken_ext.openai_public.gpt2) and their sha256. tiktoken caches a
# download under sha1(url); if both are there and intact, it loads them without the network.
_GPT2_FILES = {
    "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe":
        "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json":
        "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
}
_ANNOUNCED: set[str] = set()


def choose_tokenizer(vocab_size: int, *, where: str = "text data") -> Tokenizer:
    """GPT-2 BPE when the model's vocabulary holds it and tiktoken has it offline; else bytes."""
    if vocab_size < 256:
        raise UsageError(f"{where}: text needs vocab_size >= 256 for the byte-level tokenizer; this model has {vocab_size}")
    if vocab_size >= GPT2_VOCAB:
        if _gpt2_encoding() is not None:
            _announce("tokenizer: tiktoken's GPT-2 encoding")
            return GPT2Tokenizer()
        _announce("tokenizer: byte-level (tiktoken's GPT-2 encoding is not available offline)")
    else:
        _announce(f"tokenizer: byte-level (vocab_size {vocab_size} is too small for GPT-2's {GPT2_VOCAB} tokens)")
    return ByteTokenizer(eot=BYTE_EOT if vocab_size > BYTE_EOT else None)


def _announce(message: str) -> None:
    """Log a message once per process, however many datasets are built."""
    if message not in _ANNOUNCED:
        _ANNOUNCED.add(message)
        log.info(message)


@functools.lru_cache(maxsize=None)
def _gpt2_encoding() -> Any:
    """tiktoken's GPT-2 Encoding if it loads from the local cache, else None. Never downloads."""
    cache = _tiktoken_cache_dir()
    if cache is None or importlib.util.find_spec("tiktoken") is None:
        return None
    for url, digest in _GPT2_FILES.items():
        cached = cache / hashlib.sha1(url.encode()).hexdigest()
        # A bad hash would make tiktoken delete the file and fetch it again.
        if not cached.is_file() or hashlib.sha256(cached.read_bytes()).hexdigest() != digest:
            return None
    import tiktoken
    import tiktoken.load

    # Should this tiktoken version look for other files, fail instead of downloading.
    with mock.patch.object(tiktoken.load, "read_file", _refuse_download):
        try:
            return tiktoken.get_encoding("gpt2")
        except Exception:  # any failure to load means: not available offline
            return None


def _tiktoken_cache_dir() -> Path | None:
    """Where tiktoken caches downloads (its own rule); None when caching is disabled."""
    for variable in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if variable in os.environ:
            return Path(os.environ[variable]) if os.environ[variable] else None
    return Path(tempfile.gettempdir()) / "data-gym-cache"


def _refuse_download(blobpath: str) -> bytes:
    raise OSError(f"autotune does not download {blobpath}")


# ---------------------------------------------------------------------- batch samplers


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
    """`batch_size` random items per batch (a fresh seeded shuffle each epoch), drop_last."""

    def __init__(self, num_items: int, batch_size: int, seed: int = 0) -> None:
        super().__init__(seed)
        self.num_items = num_items
        self.batch_size = batch_size

    def __len__(self) -> int:
        return self.num_items // self.batch_size

    def batches(self, epoch: int) -> list[list[int]]:
        order = self._rng(epoch).permutation(self.num_items)
        size = self.batch_size
        return [order[k : k + size].tolist() for k in range(0, len(self) * size, size)]


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


def random_batches(
    lengths: Sequence[int] | np.ndarray, token_budget: int, seq_len: int, seed: int = 0, *, bucket: int | None = None
) -> list[list[int]]:
    """The comparison for length grouping: random order, the same budget rule."""
    check_token_budget(token_budget, seq_len)
    widths = padded_width(np.asarray(lengths, dtype=np.int64) - 1, seq_len, bucket or default_bucket(seq_len))
    return _greedy_batches(np.random.default_rng(seed).permutation(len(widths)), widths, token_budget)


# ----------------------------------------------------------------------- packed windows


class PackedDataset:
    """Documents concatenated, in a seeded random order, into one stream cut into windows
    of seq_len + 1 tokens at a stride of seq_len: consecutive windows share one token, so
    every position has a label and nothing is padded. The stream is materialized once, up
    to `max_tokens` tokens (lazily generated data has no stream to slice)."""

    def __init__(self, dataset: TokenDataset, *, seq_len: int, seed: int = 0, max_tokens: int = PACKED_MAX_TOKENS) -> None:
        order = np.random.default_rng(seed).permutation(len(dataset))
        # Enough documents for max_tokens + 1 tokens by their lengths (upper bounds: may fall short).
        bounds = np.cumsum(np.asarray(dataset.lengths, dtype=np.int64)[order])
        count = int(np.searchsorted(bounds, max_tokens + 1)) + 1
        stream = torch.cat([dataset[int(i)] for i in order[:count]])[: max_tokens + 1]
        self.stream = stream.to(torch.int32)  # half the memory of int64; ids are far below 2**31
        self.seq_len = seq_len
        self.lengths: np.ndarray = np.full(max(len(stream) - 1, 0) // seq_len, seq_len + 1)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> torch.Tensor:
        i = range(len(self))[i]
        start = i * self.seq_len
        return self.stream[start : start + self.seq_len + 1].long()


# ------------------------------------------------------------------- collate and loader


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


def build_dataloader(
    dataset: TokenDataset,
    cfg: TrainConfig,
    *,
    seq_len: int,
    seed: int = 0,
    collate_fn: Callable[[list[torch.Tensor]], Any] | None = None,
) -> DataLoader:
    """The loader of (input_ids, labels) batches for `cfg.batching`, and the one place the
    DataLoader knobs (num_workers, prefetch_factor, pin_memory, persistent_workers) apply.
    A user `collate_fn` replaces ours and receives the list of 1-D token tensors."""
    _require_int("seed", seed, 0)
    check_token_budget(cfg.token_budget, seq_len)
    bucket = default_bucket(seq_len)
    sampler: _EpochBatchSampler
    if cfg.batching == "padded":
        sampler = TokenBudgetBatchSampler(dataset.lengths, cfg.token_budget, seq_len, seed, bucket=bucket)
    else:
        if cfg.batching == "packed":
            dataset = PackedDataset(dataset, seq_len=seq_len, seed=seed)
        sampler = FixedBatchSampler(len(dataset), cfg.token_budget // seq_len, seed)
        if len(sampler) == 0:
            raise UsageError(
                f"token_budget {cfg.token_budget}: {cfg.batching} batching needs {sampler.batch_size} "
                f"sequences of {seq_len} per step, the data gives only {len(dataset)}"
            )
    return DataLoader(
        dataset,  # type: ignore[arg-type]  # map-style by protocol, not by Dataset subclass
        batch_sampler=sampler,
        num_workers=cfg.num_workers,
        prefetch_factor=cfg.prefetch_factor if cfg.num_workers > 0 else None,
        pin_memory=cfg.pin_memory,
        persistent_workers=cfg.persistent_workers,
        collate_fn=collate_fn or PadCollate(seq_len, bucket, pad_to_full=cfg.batching != "padded"),
        generator=torch.Generator().manual_seed(seed),  # seeds the workers' RNGs reproducibly
    )


# ------------------------------------------------------------------------ padding figures


def padding_fraction(batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Pad positions / all positions over (input_ids, labels) batches (pads: labels == IGNORE_INDEX)."""
    pad = total = 0
    for _, labels in batches:
        pad += int((labels == IGNORE_INDEX).sum())
        total += labels.numel()
    return pad / total if total else 0.0


@dataclass(frozen=True)
class BatchShapesReport:
    """One epoch's padding and shapes, planned from `lengths` alone (no data read; with
    upper-bound lengths the padding figures are estimates)."""

    grouped_padding: float  # padded mode: length-grouped batches
    random_padding: float  # the same budget rule on a random order
    fixed_padding: float  # the untuned baseline: token_budget // seq_len sequences padded to seq_len
    widths: tuple[int, ...]  # distinct widths of the grouped batches
    batches: int  # grouped batches per epoch


def batch_shapes_report(
    lengths: Sequence[int] | np.ndarray, token_budget: int, seq_len: int, *, seed: int = 0, bucket: int | None = None
) -> BatchShapesReport:
    """The padding figures to state: grouped vs random vs fixed, at one budget."""
    bucket = bucket or default_bucket(seq_len)
    inputs = np.asarray(lengths, dtype=np.int64) - 1
    grouped = TokenBudgetBatchSampler(lengths, token_budget, seq_len, seed, bucket=bucket).batches(0)
    fixed = FixedBatchSampler(len(inputs), token_budget // seq_len, seed).batches(0)

    def fraction(batches: list[list[int]], pad_to_full: bool) -> float:
        widths = [seq_len if pad_to_full else int(padded_width(inputs[b].max(), seq_len, bucket)) for b in batches]
        slots = sum(width * len(b) for width, b in zip(widths, batches))
        return 1 - sum(int(inputs[b].sum()) for b in batches) / slots if slots else 0.0

    return BatchShapesReport(
        grouped_padding=fraction(grouped, False),
        random_padding=fraction(random_batches(lengths, token_budget, seq_len, seed, bucket=bucket), False),
        fixed_padding=fraction(fixed, True),
        widths=tuple(sorted({int(padded_width(inputs[b].max(), seq_len, bucket)) for b in grouped})),
        batches=len(grouped),
    )


def _require_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UsageError(f"{name} must be an integer >= {minimum}, got {value!r}")
