"""Training data for a measurement: synthetic documents, or a user's file.

Every dataset is map-style. Item i is a 1-D int64 tensor of at most seq_len + 1 tokens (a
document, or a piece of a long one); the model reads inputs x[:-1] and labels x[1:].
`dataset.lengths[i]` says how many tokens item i has *before* it is loaded, so batches are
planned without reading data. A length may be an upper bound (GPT-2 BPE text is planned by
its byte count) but never an underestimate, so a planned batch never exceeds its budget.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Protocol, Sequence

import numpy as np
import torch

from autotune.config import check_int
from autotune.data.tokenize import EOT_TOKEN, Tokenizer, choose_tokenizer
from autotune.errors import UsageError

MIN_DOC_TOKENS = 8  # shortest synthetic document
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


def make_dataset(
    data: str, *, vocab_size: int, seq_len: int, seed: int = 0, min_tokens: int | None = None
) -> TokenDataset:
    """`data` is "synthetic" or a path ending in .bin (nanoGPT uint16 tokens), .txt
    (documents separated by blank lines) or .jsonl (objects with a "text" field).

    min_tokens: synthetic data has at least this many tokens; a .bin file is indexed up to
    this many (a measurement needs millions of tokens, not a whole 9B-token corpus).
    Text files are read whole. Default: `default_min_tokens(seq_len)`."""
    check_int("vocab_size", vocab_size, minimum=2)
    check_int("seq_len", seq_len, minimum=2)
    check_int("seed", seed, minimum=0)
    min_tokens = default_min_tokens(seq_len) if min_tokens is None else min_tokens
    check_int("min_tokens", min_tokens, minimum=1)
    if data == "synthetic":
        return SyntheticDataset(vocab_size=vocab_size, seq_len=seq_len, seed=seed, min_tokens=min_tokens)
    path = check_data_spec(data)
    kind = path.suffix.lower()
    if kind == ".bin":
        return BinDataset(path, vocab_size=vocab_size, seq_len=seq_len, max_tokens=min_tokens)
    tokenizer = choose_tokenizer(vocab_size, where=str(path))
    documents = _txt_documents(path) if kind == ".txt" else _jsonl_documents(path)
    return TextDataset(documents, tokenizer=tokenizer, seq_len=seq_len, where=str(path))


def check_data_spec(data: str) -> Path:
    """The file a `--data` names, checked without reading it: its kind and that it is there."""
    path = Path(data)
    if path.suffix.lower() not in (".bin", ".txt", ".jsonl"):
        raise UsageError(f"data {data!r}: expected synthetic or a file ending in .bin, .txt or .jsonl")
    if not path.is_file():
        raise UsageError(f"data file {data} {'is not a file' if path.exists() else 'not found'}")
    return path


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
                f'{path}:{lineno}: invalid JSON ({exc.msg}); expected an object with a "text" string'
            ) from None
        text = record.get("text") if isinstance(record, dict) else None
        if not isinstance(text, str):
            raise UsageError(f'{path}:{lineno}: expected a JSON object with a "text" string')
        documents.append(text)
    return documents


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
