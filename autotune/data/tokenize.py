"""Tokenizers for text data: GPT-2's BPE through tiktoken when its files are cached
locally (nothing is ever downloaded), else UTF-8 bytes."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError, UsageError

log = logging.getLogger(__name__)

EOT_TOKEN = 50256  # GPT-2 end-of-text; documents in .bin files are split at it
GPT2_VOCAB = 50257  # tokens of GPT-2's encoding, EOT_TOKEN being the last
BYTE_EOT = 256  # document end of the byte-level tokenizer, right after the 256 byte values


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
_GPT2_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"
_GPT2_FILES = {
    _GPT2_URL + "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    _GPT2_URL + "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
}
# GPT-2's pre-tokenizer pattern, as tiktoken_ext.openai_public.gpt2 gives it.
_GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_ANNOUNCED: set[str] = set()


def choose_tokenizer(vocab_size: int, *, where: str = "text data") -> Tokenizer:
    """GPT-2 BPE when the model's vocabulary holds it and tiktoken has it offline; else bytes."""
    if vocab_size < 256:
        raise UsageError(
            f"{where}: text needs vocab_size >= 256 for the byte-level tokenizer; this model has {vocab_size}"
        )
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
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    # Both files are in tiktoken's cache with the right hashes (checked above), and tiktoken
    # reads a cached file whose hash matches instead of fetching its URL: nothing downloads.
    (vocab_url, vocab_hash), (encoder_url, encoder_hash) = _GPT2_FILES.items()
    try:
        ranks = data_gym_to_mergeable_bpe_ranks(
            vocab_bpe_file=vocab_url,
            encoder_json_file=encoder_url,
            vocab_bpe_hash=vocab_hash,
            encoder_json_hash=encoder_hash,
        )
        return tiktoken.Encoding(
            name="gpt2", pat_str=_GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": EOT_TOKEN}
        )
    except Exception:  # any failure to load means: not available offline
        return None


def _tiktoken_cache_dir() -> Path | None:
    """Where tiktoken caches downloads (its own rule); None when caching is disabled."""
    for variable in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if variable in os.environ:
            return Path(os.environ[variable]) if os.environ[variable] else None
    return Path(tempfile.gettempdir()) / "data-gym-cache"
