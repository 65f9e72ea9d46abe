"""Tests of autotune.data: budgets, padding, shapes, modes, shuffling, workers, files."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from autotune.config import IGNORE_INDEX, TrainConfig
from autotune.data import tokenize
from autotune.data.batching import (
    PAD_TOKEN_ID,
    FixedBatchSampler,
    PadCollate,
    TokenBudgetBatchSampler,
    batch_shapes_report,
    build_dataloader,
    default_bucket,
    padding_fraction,
    random_batches,
)
from autotune.data.datasets import make_dataset
from autotune.data.tokenize import BYTE_EOT, EOT_TOKEN
from autotune.errors import UsageError

SEQ = 128
BUDGET = 4096


@pytest.fixture(scope="module")
def synthetic() -> data.SyntheticDataset:
    # Small but with the real length distribution: ~5,000 documents.
    return make_dataset("synthetic", vocab_size=320, seq_len=SEQ, seed=0, min_tokens=SEQ * 2048)


def loader(dataset, **knobs):
    knobs.setdefault("token_budget", BUDGET)
    return build_dataloader(dataset, TrainConfig(**knobs), seq_len=SEQ, seed=0)


def check_alignment(input_ids: torch.Tensor, labels: torch.Tensor, items: list[torch.Tensor]) -> None:
    """Row r holds items[r]: inputs x[:-1] and labels x[1:], then pads in both exactly after."""
    for row, item in enumerate(items):
        size = len(item) - 1
        assert torch.equal(input_ids[row, :size], item[:-1])
        assert torch.equal(labels[row, :size], item[1:])
        assert (input_ids[row, size:] == PAD_TOKEN_ID).all()
        assert (labels[row, size:] == IGNORE_INDEX).all()


# ------------------------------------------------------------------------- padded


def test_padded_batches_respect_budget_and_buckets(synthetic):
    bucket = default_bucket(SEQ)
    widths = set()
    batches = 0
    for input_ids, labels in loader(synthetic, batching="padded"):
        batches += 1
        width = input_ids.shape[1]
        assert input_ids.numel() <= BUDGET
        assert width % bucket == 0 or width == SEQ
        assert labels.shape == input_ids.shape and input_ids.dtype == labels.dtype == torch.long
        widths.add(width)
    assert batches > 50
    # Few distinct shapes for torch.compile.
    assert (default_bucket(128), default_bucket(256), default_bucket(1024)) == (16, 64, 64)
    assert len(widths) <= SEQ // bucket


def test_padded_batches_fill_the_budget_for_their_width(synthetic):
    # Widest first, each batch but the last-cut one holds token_budget // width sequences.
    sampler = TokenBudgetBatchSampler(synthetic.lengths, BUDGET, SEQ, seed=3)
    collate = PadCollate(SEQ, default_bucket(SEQ))
    short = 0
    for batch in sampler:
        input_ids, _ = collate([synthetic[i] for i in batch])
        rows, width = input_ids.shape
        short += rows != BUDGET // width
    assert short <= 1


def test_grouping_pads_far_less_than_random_batches(synthetic):
    collate = PadCollate(SEQ, default_bucket(SEQ))
    grouped = padding_fraction(loader(synthetic, batching="padded"))
    shuffled = padding_fraction(
        collate([synthetic[i] for i in batch]) for batch in random_batches(synthetic.lengths, BUDGET, SEQ, seed=0)
    )
    print(f"\npadding at seq_len {SEQ}, budget {BUDGET}: length-grouped {grouped:.3f}, random {shuffled:.3f}")
    assert grouped < 0.5 * shuffled
    # The planning helper states the same figures without reading data (lengths are exact here).
    report = batch_shapes_report(synthetic.lengths, BUDGET, SEQ, seed=0)
    assert report.grouped_padding == pytest.approx(grouped)
    assert report.random_padding == pytest.approx(shuffled)
    assert report.fixed_padding > report.grouped_padding
    assert len(report.widths) <= SEQ // default_bucket(SEQ)


def test_collate_pads_labels_exactly_where_inputs_are_padding():
    items = [torch.arange(1, 6), torch.arange(10, 30), torch.arange(40, 42)]
    input_ids, labels = PadCollate(seq_len=64, bucket=16)(items)
    assert input_ids.shape == (3, 32)  # longest input 19 -> bucket of 16 -> 32
    check_alignment(input_ids, labels, items)
    input_ids, labels = PadCollate(seq_len=64, bucket=16, pad_to_full=True)(items)
    assert input_ids.shape == (3, 64)
    check_alignment(input_ids, labels, items)


def test_loader_batches_are_the_dataset_items(synthetic):
    sampler_batches = TokenBudgetBatchSampler(synthetic.lengths, BUDGET, SEQ, seed=0).batches(0)
    for batch, (input_ids, labels) in zip(sampler_batches[:5], loader(synthetic, batching="padded")):
        check_alignment(input_ids, labels, [synthetic[i] for i in batch])


def test_budget_smaller_than_context_is_rejected(synthetic):
    with pytest.raises(UsageError, match="token_budget 100 is smaller than the context length 128"):
        loader(synthetic, token_budget=100)


# ----------------------------------------------------------------- packed and fixed


def test_packed_windows_are_contiguous_and_unpadded(synthetic):
    dl = loader(synthetic, batching="packed")
    stream = dl.dataset.stream.long()
    seen = 0
    for input_ids, labels in dl:
        assert input_ids.shape == (BUDGET // SEQ, SEQ)
        assert (labels != IGNORE_INDEX).all()
        assert torch.equal(labels[:, :-1], input_ids[:, 1:])
        seen += 1
    assert seen == len(dl) > 0
    # Windows overlap by one token: window i is stream[i*SEQ : i*SEQ + SEQ + 1].
    window = dl.dataset[3]
    assert torch.equal(window, stream[3 * SEQ : 4 * SEQ + 1])
    # Documents appear whole and in order within the stream.
    first = synthetic[int(np.random.default_rng(0).permutation(len(synthetic))[0])]
    assert torch.equal(stream[: len(first)], first)


def test_fixed_batches_are_full_width(synthetic):
    dl = loader(synthetic, batching="fixed")
    assert len(dl) == len(synthetic) // (BUDGET // SEQ)
    for input_ids, labels in dl:
        assert input_ids.shape == labels.shape == (BUDGET // SEQ, SEQ)


def test_fixed_batching_needs_one_full_batch():
    tiny = make_dataset("synthetic", vocab_size=320, seq_len=SEQ, min_tokens=100)
    with pytest.raises(UsageError, match="fixed batching needs 32 sequences"):
        loader(tiny, batching="fixed")


# ----------------------------------------------------------------------- shuffling


@pytest.mark.parametrize(
    "make_sampler",
    [
        lambda lengths, seed: TokenBudgetBatchSampler(lengths, BUDGET, SEQ, seed),
        lambda lengths, seed: FixedBatchSampler(len(lengths), BUDGET // SEQ, seed),
    ],
    ids=["padded", "fixed"],
)
def test_epochs_differ_and_seeds_replay(synthetic, make_sampler):
    sampler = make_sampler(synthetic.lengths, 0)
    first, second = list(sampler), list(sampler)
    assert first != second
    replay = make_sampler(synthetic.lengths, 0)
    assert list(replay) == first and list(replay) == second
    assert list(make_sampler(synthetic.lengths, 1)) != first


def test_loader_epochs_differ_and_replay(synthetic):
    def epochs(dl):
        return [[input_ids[:, :4].clone() for input_ids, _ in dl] for _ in range(2)]

    first = epochs(loader(synthetic, batching="packed"))
    again = epochs(loader(synthetic, batching="packed"))
    assert all(torch.equal(a, b) for a, b in zip(first[0], again[0]))
    assert not all(torch.equal(a, b) for a, b in zip(first[0], first[1]))


# ------------------------------------------------------------ DataLoader knobs


class PidDataset:
    """Each item carries the pid of the process that made it."""

    def __init__(self, size: int) -> None:
        self.lengths = [3] * size

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((3,), os.getpid(), dtype=torch.long)


def worker_pids(dl) -> set[int]:
    return {int(pid) for input_ids, _ in dl for pid in input_ids[:, 0]}


@pytest.mark.parametrize("persistent", [True, False])
def test_workers_are_processes_and_persistence_keeps_them(persistent):
    # 64 items of width 16 at budget 64: 16 batches, spread over both workers.
    dl = build_dataloader(
        PidDataset(64),
        TrainConfig(num_workers=2, persistent_workers=persistent, token_budget=64),
        seq_len=16,
    )
    first, second = worker_pids(dl), worker_pids(dl)
    assert len(first) == 2 and os.getpid() not in first
    if persistent:
        assert first == second
    else:
        assert len(second) == 2 and not first & second


def test_prefetch_and_pin_memory_reach_the_loader(synthetic):
    dl = loader(synthetic, num_workers=2, prefetch_factor=5, pin_memory=True)
    assert (dl.num_workers, dl.prefetch_factor, dl.pin_memory, dl.persistent_workers) == (2, 5, True, False)
    dl = loader(synthetic)
    assert (dl.num_workers, dl.prefetch_factor, dl.pin_memory) == (0, None, False)


def test_user_collate_replaces_ours(synthetic):
    calls = []

    def collate(items):
        calls.append(items)
        return "mine"

    dl = build_dataloader(synthetic, TrainConfig(token_budget=BUDGET), seq_len=SEQ, collate_fn=collate)
    assert next(iter(dl)) == "mine"
    assert all(isinstance(item, torch.Tensor) and item.dim() == 1 for item in calls[0])


# ------------------------------------------------------------------------- synthetic


def test_datasets_pickle_for_spawned_workers(synthetic, tmp_path):
    path = write_bin(tmp_path / "train.bin", [5, 6, 7, EOT_TOKEN] * 20_000)
    text = tmp_path / "docs.txt"
    text.write_text("one\n\ntwo")
    for dataset in (synthetic, make_dataset(str(path), vocab_size=50304, seq_len=SEQ),
                    make_dataset(str(text), vocab_size=320, seq_len=SEQ)):
        restored = pickle.loads(pickle.dumps(dataset))
        # A .bin travels as its path and index; each process maps the file itself.
        assert getattr(restored, "_tokens", None) is None
        assert torch.equal(restored[1], dataset[1])
    assert torch.equal(pickle.loads(pickle.dumps(PadCollate(8, 4)))([torch.arange(3)])[0], torch.tensor([[0, 1, 0, 0]]))


def test_synthetic_items_are_reproducible_and_in_range(synthetic):
    assert len(synthetic) > 1000
    assert int(np.asarray(synthetic.lengths).max()) <= SEQ + 1
    assert int(np.asarray(synthetic.lengths).min()) >= 2
    again = make_dataset("synthetic", vocab_size=320, seq_len=SEQ, seed=0, min_tokens=SEQ * 2048)
    for i in (0, 7, len(synthetic) - 1):
        item = synthetic[i]
        assert item.dtype == torch.long and len(item) == synthetic.lengths[i]
        assert torch.equal(item, again[i])
        assert 1 <= int(item.min()) and int(item.max()) < 320
    # Log-normal with median ~ seq_len / 4 before chunking: most documents short.
    assert SEQ / 8 < np.median(synthetic.lengths) < SEQ / 2
    with pytest.raises(IndexError):
        synthetic[len(synthetic)]


def test_synthetic_default_is_cheap_and_lasts_a_measurement():
    start = time.perf_counter()
    dataset = make_dataset("synthetic", vocab_size=50304, seq_len=1024)
    dl = build_dataloader(dataset, TrainConfig(token_budget=65536), seq_len=1024)
    next(iter(dl))
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, f"building took {elapsed:.2f} s"
    assert len(build_dataloader(dataset, TrainConfig(token_budget=8 * 1024), seq_len=1024)) >= 300
    assert len(dl) >= 60  # one ~50-step measurement stays within an epoch even at 64 sequences a step


# ------------------------------------------------------------------------ .bin files


def write_bin(path: Path, tokens: list[int]) -> Path:
    np.array(tokens, dtype=np.uint16).tofile(path)
    return path


def test_bin_documents_split_at_eot_and_chunked(tmp_path):
    path = write_bin(tmp_path / "train.bin", [5, 6, 7, EOT_TOKEN, 8, 9, EOT_TOKEN, EOT_TOKEN, *range(10, 22)])
    dataset = make_dataset(str(path), vocab_size=50304, seq_len=4)
    items = [dataset[i].tolist() for i in range(len(dataset))]
    # A lone EOT has no label and is dropped; 12 unterminated tokens chunk to 5 + 5 + 2.
    assert items == [[5, 6, 7, EOT_TOKEN], [8, 9, EOT_TOKEN], [10, 11, 12, 13, 14], [15, 16, 17, 18, 19], [20, 21]]
    assert list(dataset.lengths) == [len(item) for item in items]
    assert all(dataset[i].dtype == torch.long for i in range(len(dataset)))


def test_bin_token_ids_must_fit_the_vocabulary(tmp_path):
    path = write_bin(tmp_path / "train.bin", [5, 6, EOT_TOKEN, 7, 8])
    with pytest.raises(UsageError, match="token id 50256 >= vocab_size 320 of this model"):
        make_dataset(str(path), vocab_size=320, seq_len=SEQ)


@pytest.mark.parametrize("content, why", [(b"", "empty"), (b"\x01\x00\x02", "odd size of 3 bytes")])
def test_bin_must_be_uint16_tokens(tmp_path, content, why):
    path = tmp_path / "bad.bin"
    path.write_bytes(content)
    with pytest.raises(UsageError, match=why):
        make_dataset(str(path), vocab_size=50304, seq_len=SEQ)


def test_bin_is_indexed_up_to_min_tokens(tmp_path):
    path = write_bin(tmp_path / "big.bin", [3] * 100 + [60000])  # the bad id lies past the limit
    dataset = make_dataset(str(path), vocab_size=320, seq_len=8, min_tokens=50)
    assert int(np.sum(dataset.lengths)) <= 50


# ------------------------------------------------------------------------ text files


def byte_items(dataset) -> list[bytes]:
    """Each item's bytes, checking that it ends with the byte-level EOT or is a piece."""
    return [bytes(t for t in dataset[i].tolist() if t != BYTE_EOT) for i in range(len(dataset))]


def test_txt_round_trips_bytes_with_exact_lengths(tmp_path):
    path = tmp_path / "docs.txt"
    path.write_text("first doc\nstill first\n\n\n  \nsécond ✓\n\nthird\n", encoding="utf-8")
    dataset = make_dataset(str(path), vocab_size=320, seq_len=SEQ)
    assert byte_items(dataset) == [b"first doc\nstill first", "sécond ✓".encode(), b"third"]
    assert all(dataset[i][-1] == BYTE_EOT for i in range(len(dataset)))
    assert list(dataset.lengths) == [len(dataset[i]) for i in range(len(dataset))]


def test_long_text_splits_on_character_boundaries(tmp_path):
    text = "é✓a" * 40  # 2-, 3- and 1-byte characters
    path = tmp_path / "long.txt"
    path.write_text(text, encoding="utf-8")
    dataset = make_dataset(str(path), vocab_size=320, seq_len=16)
    pieces = byte_items(dataset)
    assert len(pieces) > 1 and b"".join(pieces) == text.encode()
    for i, piece in enumerate(pieces):
        piece.decode("utf-8")  # each piece is whole characters
        assert len(dataset[i]) == dataset.lengths[i] <= 17
    assert dataset[len(dataset) - 1][-1] == BYTE_EOT


def test_jsonl_documents(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(json.dumps({"text": t, "id": n}) for n, t in enumerate(["alpha", "beta\u2028gamma"])) + "\n\n")
    dataset = make_dataset(str(path), vocab_size=320, seq_len=SEQ)
    assert byte_items(dataset) == [b"alpha", "beta\u2028gamma".encode()]


@pytest.mark.parametrize("bad", ['{"text": "x"', '["text"]', '{"txt": "x"}', '{"text": 3}'])
def test_bad_jsonl_line_is_named(tmp_path, bad):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"text": "fine"}\n\n' + bad + "\n")
    with pytest.raises(UsageError, match=rf"docs\.jsonl:3: .*\"text\" string"):
        make_dataset(str(path), vocab_size=320, seq_len=SEQ)


def test_missing_and_unknown_files_are_named(tmp_path):
    with pytest.raises(UsageError, match="nowhere.txt not found"):
        make_dataset(str(tmp_path / "nowhere.txt"), vocab_size=320, seq_len=SEQ)
    with pytest.raises(UsageError, match="data 'corpus.csv': expected synthetic or"):
        make_dataset("corpus.csv", vocab_size=320, seq_len=SEQ)
    (tmp_path / "empty.txt").write_text("\n\n  \n")
    with pytest.raises(UsageError, match="empty.txt: no documents"):
        make_dataset(str(tmp_path / "empty.txt"), vocab_size=320, seq_len=SEQ)


def test_text_needs_a_byte_vocabulary(tmp_path):
    path = tmp_path / "docs.txt"
    path.write_text("hello")
    with pytest.raises(UsageError, match=r"docs\.txt: text needs vocab_size >= 256"):
        make_dataset(str(path), vocab_size=200, seq_len=SEQ)


# ------------------------------------------------------------------------ tokenizers


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
    assert all(input_ids.numel() <= 32 for input_ids, _ in dl)
