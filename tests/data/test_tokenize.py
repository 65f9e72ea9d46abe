"""autotune.data.tokenize: which tokenizer, tiktoken only from an intact offline cache, BPE
lengths as upper bounds."""

from __future__ import annotations

import hashlib
import logging

from autotune.config import TrainConfig
from autotune.data import tokenize
from autotune.data.batching import (
    build_dataloader,
)
from autotune.data.datasets import make_dataset
from autotune.data.tokenize import EOT_TOKEN


def test_tokenizer_choice_is_logged_once(caplog, monkeypatch):
    monkeypatch.setattr(tokenize, "_ANNOUNCED", set())
    with caplog.at_level(logging.INFO, logger="autotune.data.tokenize"):
        tokenize.choose_tokenizer(320)
        tokenize.choose_tokenizer(320)
    assert [r.getMessage() for r in caplog.records].count(
        "tokenizer: byte-level (vocab_size 320 is too small for GPT-2's 50257 tokens)"
    ) == 1


def test_tiktoken_is_used_only_from_an_intact_cache(tmp_path, monkeypatch):
    import tiktoken.load

    def no_network(*args, **kwargs):
        raise AssertionError("tried to download")

    monkeypatch.setattr(tiktoken.load, "read_file", no_network)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    tokenize._gpt2_encoding.cache_clear()
    try:
        assert tokenize._gpt2_encoding() is None  # empty cache
        corrupt = [tmp_path / hashlib.sha1(url.encode()).hexdigest() for url in tokenize._GPT2_FILES]
        for path in corrupt:
            path.write_bytes(b"not the real file")
        assert tokenize._gpt2_encoding.__wrapped__() is None  # bad hashes: not used, not deleted
        assert all(path.exists() for path in corrupt)
        assert isinstance(tokenize.choose_tokenizer(50304), tokenize.ByteTokenizer)
    finally:
        tokenize._gpt2_encoding.cache_clear()


class CharEncoding:
    """Stands in for tiktoken's GPT-2 encoding: one token per character (<= its bytes)."""

    def encode_ordinary(self, text: str) -> list[int]:
        return [ord(c) % 50000 for c in text]


def test_bpe_lengths_are_upper_bounds(tmp_path, monkeypatch):
    monkeypatch.setattr(tokenize, "_gpt2_encoding", lambda: CharEncoding())
    path = tmp_path / "docs.txt"
    text = "é✓a" * 30
    path.write_text(text + "\n\nshort", encoding="utf-8")
    dataset = make_dataset(str(path), vocab_size=50304, seq_len=16)
    assert isinstance(dataset.tokenizer, tokenize.GPT2Tokenizer)
    items = [dataset[i] for i in range(len(dataset))]
    assert all(len(item) <= dataset.lengths[i] <= 17 for i, item in enumerate(items))
    assert any(len(item) < dataset.lengths[i] for i, item in enumerate(items))
    assert [int(item[-1]) for item in items].count(EOT_TOKEN) == 2  # one per document
    assert "".join(chr(t) for item in items for t in item.tolist() if t != EOT_TOKEN) == text + "short"
    # Planned from upper bounds, padded batches still keep the budget.
    dl = build_dataloader(dataset, TrainConfig(token_budget=32), seq_len=16)
    sizes = [input_ids.numel() for input_ids, _ in dl]
    assert sizes and max(sizes) <= 32  # batches there are, and each within the budget
