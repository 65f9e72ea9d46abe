"""`Recipe.dataloader` fits the user's model: its context (never the tuned model's), its label
convention (Hugging Face models shift labels themselves: proven on a real HF model's loss), and
documents too short to train on skipped and counted in one log line."""

from __future__ import annotations

import logging
import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from autotune.config import IGNORE_INDEX, TrainConfig
from autotune.errors import UsageError
from autotune.model.gpt import GPT, GPTConfig
from autotune.recipe import Recipe
from tests.helpers import HF, lazy

pytestmark = HF
transformers = lazy("transformers")

TUNED_SEQ_LEN = 128  # the context of the model the recipe was tuned on


def recipe(**knobs) -> Recipe:
    return Recipe(
        config=TrainConfig(**{"token_budget": 1024, **knobs}),
        model={"name": "gpt2-tiny", "seq_len": TUNED_SEQ_LEN, "n_layer": 2, "vocab_size": 320},
    )


def documents(lengths, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 320, int(n)).tolist() for n in lengths]


def hf_gpt2(context: int = 256) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=64, n_positions=context, vocab_size=320, bos_token_id=256, eos_token_id=256
    )
    return transformers.GPT2LMHeadModel(config).eval()


# --- the sequence length is the user's model's ---------------------------------------------------------


def test_seq_len_comes_from_the_model_it_is_used_with():
    """The issue's failure: a 214-token document, a recipe tuned at context 128, a model of 256."""
    docs = documents([214, 40, 90, 256, 7])
    batches = list(recipe().dataloader(docs, for_model=hf_gpt2(256)))
    assert max(b["input_ids"].shape[1] for b in batches) == 256  # the longest document, whole
    seen = sorted(int((b["labels"] != IGNORE_INDEX).sum(1)[i]) for b in batches for i in range(len(b["labels"])))
    assert seen == sorted(len(d) for d in docs)  # every document once, uncut (unshifted: labels = inputs)


def test_seq_len_is_never_the_tuned_models_without_a_model(caplog):
    docs = documents([214, 30, 50])
    with caplog.at_level(logging.INFO, logger="autotune.recipe.training"):
        x, y = next(iter(recipe().dataloader(docs)))
    assert x.shape[1] == 213  # the longest document's inputs, not the recipe's 128
    assert "seq_len 213, from the longest document" in caplog.text


def test_seq_len_given_and_checked_against_the_model():
    docs = documents([60, 30])
    x = next(iter(recipe().dataloader(docs, seq_len=64, labels="aligned")))["input_ids"]
    assert x.shape[1] == 64
    with pytest.raises(UsageError, match="seq_len 512 is longer than the model's context 256"):
        recipe().dataloader(docs, for_model=hf_gpt2(256), seq_len=512)
    with pytest.raises(UsageError, match=r"dataset item 0 has 300 tokens, more than the model's context 256; cut"):
        recipe().dataloader(documents([300]), for_model=hf_gpt2(256))


# --- short documents -------------------------------------------------------------------------------------


def test_documents_too_short_are_skipped_and_counted_once(caplog):
    docs = documents([1, 50, 0, 33, 1, 64])
    with caplog.at_level(logging.WARNING, logger="autotune.recipe.training"):
        loader = recipe().dataloader(docs)
        tokens = sum(int((y != IGNORE_INDEX).sum()) for _, y in loader)
    assert tokens == 49 + 32 + 63
    lines = [r.getMessage() for r in caplog.records if r.name == "autotune.recipe.training"]
    assert lines == ["recipe.dataloader: skipped 3 of 6 documents shorter than 2 tokens (nothing to predict)"]


def test_skipped_documents_keep_their_indices_for_workers():
    docs = documents([1, 20, 1, 30])
    loader = recipe(num_workers=1, prefetch_factor=2).dataloader(docs, labels="unshifted")
    rows = [b["input_ids"][i][b["labels"][i] != IGNORE_INDEX].tolist() for b in loader for i in range(len(b["labels"]))]
    assert sorted(rows) == sorted([docs[1], docs[3]])


def test_a_dataset_with_nothing_to_learn():
    with pytest.raises(UsageError, match="no document has at least 2 tokens"):
        recipe().dataloader([[5], [7]])


# --- the label convention --------------------------------------------------------------------------------


def test_hf_batches_are_unshifted_with_minus_100_at_pads():
    batch = next(iter(recipe().dataloader(documents([40, 17, 33, 8]), for_model=hf_gpt2())))
    assert set(batch) == {"input_ids", "labels"}  # no mask: see Recipe.dataloader
    real = batch["labels"] != IGNORE_INDEX
    assert torch.equal(batch["labels"][real], batch["input_ids"][real])
    assert (batch["input_ids"][~real] == 0).all()
    assert batch["input_ids"].shape[1] % 16 == 0  # bucketed widths: few shapes for compile
    masked = next(iter(recipe().dataloader(documents([40, 17]), for_model=hf_gpt2(), attention_mask=True)))
    assert torch.equal(masked["attention_mask"].bool(), masked["labels"] != IGNORE_INDEX)


def test_autotune_gpt_batches_are_aligned_dicts():
    model = GPT(GPTConfig(block_size=64, vocab_size=320, n_layer=1, n_head=2, n_embd=32))
    docs = [list(range(100 * i, 100 * i + n)) for i, n in enumerate([65, 10, 33])]
    batch = next(iter(recipe().dataloader(docs, for_model=model)))
    real = batch["labels"] != IGNORE_INDEX
    assert torch.equal(batch["labels"][real], batch["input_ids"][real] + 1)  # label t = x[t + 1]
    assert batch["input_ids"].shape[1] <= 64
    assert model(**batch).dim() == 0  # model(**batch) is the call


def test_batches_named_for_a_nanogpt_style_forward():
    class NanoGPTStyle(torch.nn.Module):
        block_size, vocab_size = 64, 320

        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(320, 8)
            self.head = torch.nn.Linear(8, 320)

        def forward(self, idx, targets=None):
            logits = self.head(self.emb(idx))
            loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
            return logits, loss

    batch = next(iter(recipe().dataloader(documents([20, 30]), for_model=NanoGPTStyle())))
    assert set(batch) == {"idx", "targets"}


def test_labels_without_a_model_and_a_conflict_with_one():
    docs = documents([20, 30])
    batch = next(iter(recipe().dataloader(docs, labels="unshifted")))
    # Unshifted (what an HF model expects without one): each row's labels are its document,
    # every token of it, then padding ignored; the inputs are the same document (padded with 0).
    labels, inputs = batch["labels"], batch["input_ids"]
    rows = [row[row != IGNORE_INDEX].tolist() for row in labels]
    assert sorted(rows, key=len) == sorted(docs, key=len)
    assert torch.equal(inputs[labels != IGNORE_INDEX], labels[labels != IGNORE_INDEX])
    assert bool((inputs[labels == IGNORE_INDEX] == 0).all())
    aligned = next(iter(recipe().dataloader(docs, labels="aligned")))  # label t = x[t + 1]
    assert sorted((row[row != IGNORE_INDEX].tolist() for row in aligned["labels"]), key=len) == sorted(
        (d[1:] for d in docs), key=len
    )
    with pytest.raises(UsageError, match="labels must be one of aligned, unshifted, got 'shifted'"):
        recipe().dataloader(documents([20]), labels="shifted")
    with pytest.raises(UsageError, match=r"labels='aligned', but GPT2LMHeadModel expects unshifted labels"):
        recipe().dataloader(documents([20]), for_model=hf_gpt2(), labels="aligned")


@pytest.mark.parametrize("batching", ["padded", "fixed", "packed"])
def test_every_batching_mode_fits_an_hf_model(batching):
    docs = documents([200, 120, 64, 250, 31] * 20)
    batches = list(recipe(batching=batching).dataloader(docs, for_model=hf_gpt2(256)))
    for batch in batches:
        assert batch["input_ids"].numel() <= 1024 and batch["input_ids"].shape[1] <= 256
    if batching == "packed":  # disjoint blocks of the context, as run_clm.py packs them...
        assert all(b["input_ids"].shape[1] == 256 for b in batches)
        assert [len(b["input_ids"]) for b in batches].count(4) >= len(batches) - 1
        rows = torch.cat([b["labels"] for b in batches])
        # ...all full but the remainder's, which is kept (an epoch is every token)
        assert int((rows == IGNORE_INDEX).any(dim=1).sum()) == 1
        assert int((rows != IGNORE_INDEX).sum()) == sum(len(d) for d in docs)


def test_the_collate_pickles_for_workers():
    loader = recipe().dataloader(documents([20, 30]), for_model=hf_gpt2())
    again = pickle.loads(pickle.dumps(loader.collate_fn))
    items = [torch.arange(1, 6), torch.arange(1, 3)]
    unpickled, original = again(items), loader.collate_fn(items)
    assert list(unpickled) == list(original) == ["input_ids", "labels"]
    assert all(torch.equal(unpickled[k], original[k]) for k in original)


# --- the alignment, proven on a Hugging Face model's own loss -------------------------------------------


def counting(count: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """Documents that count up from a random start (mod vocab): the next token is this one + 1."""
    rng = np.random.default_rng(seed)
    return [
        [int(s + t) % vocab for t in range(n)]
        for s, n in zip(rng.integers(0, vocab, count), rng.integers(10, 65, count))
    ]


@pytest.mark.slow
def test_label_alignment_on_an_hf_models_loss():
    """The same documents, two ways: HF's own loss on the unshifted batches for_model gives, and
    cross-entropy of HF's logits against autotune's aligned labels (the target of position t is
    x[t + 1]): equal, batch by batch. Then the model is trained on the for_model batches with
    HF's loss: had they been shifted twice (what a user got before), it would learn x[t + 2]
    from x[t]. It learns x[t + 1]: scored on aligned labels its loss is near 0, scored on
    twice-shifted ones it is large."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=64, n_positions=64, vocab_size=64, bos_token_id=0)
    model = transformers.GPT2LMHeadModel(config).eval()
    docs = counting(16, vocab=64)
    small = Recipe(config=TrainConfig(token_budget=512, batching="fixed"), model={"seq_len": TUNED_SEQ_LEN})
    hf_batches = list(small.dataloader(docs, for_model=model))
    aligned_batches = list(small.dataloader(docs, seq_len=63))  # inputs x[:-1], as autotune measures
    assert len(hf_batches) == len(aligned_batches) == 2

    def aligned_loss(x, y):
        logits = model(input_ids=x).logits
        return F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE_INDEX)

    with torch.no_grad():
        for hf_batch, (x, y) in zip(hf_batches, aligned_batches):
            assert model(**hf_batch).loss.item() == pytest.approx(aligned_loss(x, y).item(), rel=1e-5)

    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = Recipe(config=TrainConfig(token_budget=512), model={"seq_len": TUNED_SEQ_LEN}).dataloader(
        docs, for_model=model
    )
    batches = [b for _ in range(25) for b in loader][:25]
    for batch in batches:
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    x, y = aligned_batches[0]
    with torch.no_grad():
        learned = aligned_loss(x, y).item()
        twice_shifted = model(input_ids=x, labels=y).loss.item()
    assert learned < 0.5 < 3.0 < twice_shifted, (learned, twice_shifted)
