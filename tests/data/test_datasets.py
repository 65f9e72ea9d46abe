"""autotune.data.datasets: synthetic data, .bin token files, text and JSON lines files."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from autotune.config import TrainConfig
from autotune.data.batching import (
    PadCollate,
    build_dataloader,
)
from autotune.data.datasets import make_dataset
from autotune.data.tokenize import BYTE_EOT, EOT_TOKEN
from autotune.errors import UsageError
from tests.helpers import SEQ


def test_datasets_pickle_for_spawned_workers(synthetic, tmp_path):
    path = write_bin(tmp_path / "train.bin", [5, 6, 7, EOT_TOKEN] * 20_000)
    text = tmp_path / "docs.txt"
    text.write_text("one\n\ntwo")
    for dataset in (
        synthetic,
        make_dataset(str(path), vocab_size=50304, seq_len=SEQ),
        make_dataset(str(text), vocab_size=320, seq_len=SEQ),
    ):
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
    dataset = make_dataset("synthetic", vocab_size=50304, seq_len=1024)
    dl = build_dataloader(dataset, TrainConfig(token_budget=65536), seq_len=1024)
    next(iter(dl))
    # Cheap by construction, not by a clock: it holds document lengths only (ids are drawn per item).
    assert dataset.lengths.nbytes < 2**20 and not hasattr(dataset, "tokens")
    assert len(build_dataloader(dataset, TrainConfig(token_budget=8 * 1024), seq_len=1024)) >= 300
    assert len(dl) >= 60  # one ~50-step measurement stays within an epoch even at 64 sequences a step


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
    path.write_text(
        "\n".join(json.dumps({"text": t, "id": n}) for n, t in enumerate(["alpha", "beta\u2028gamma"])) + "\n\n"
    )
    dataset = make_dataset(str(path), vocab_size=320, seq_len=SEQ)
    assert byte_items(dataset) == [b"alpha", "beta\u2028gamma".encode()]


@pytest.mark.parametrize("bad", ['{"text": "x"', '["text"]', '{"txt": "x"}', '{"text": 3}'])
def test_bad_jsonl_line_is_named(tmp_path, bad):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"text": "fine"}\n\n' + bad + "\n")
    with pytest.raises(UsageError, match=r"docs\.jsonl:3: .*\"text\" string"):
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
