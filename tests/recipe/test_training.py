"""autotune.recipe.training, the recipe applied in a user's training code: apply_to_model,
dataloader, autocast, grad_scaler; and the example training script run with a recipe."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn

from autotune.errors import RecipeEnvironmentWarning, UsageError
from autotune.knobs.checkpoint import is_checkpointed
from autotune.knobs.compile import is_compiled
from autotune.recipe.training import TokenSequences
from tests.fixture_models import make_llama, make_odd_path
from tests.helpers import ROOT, cpu_recipe, save_recipe


def test_apply_to_model_at_a_path_autotune_cannot_guess(aot_eager):  # nothing runs: no inductor
    model = make_odd_path()  # blocks at backbone.stack
    model.backbone.stack.append(copy.deepcopy(model.backbone.stack[0]))  # 3 blocks
    keys = set(model.state_dict())
    recipe = cpu_recipe(checkpoint_layers=(1,), compile_mode="default")
    with pytest.raises(UsageError, match="cannot find the transformer blocks"):
        recipe.apply_to_model(make_odd_path())
    out = recipe.apply_to_model(model, block_path="backbone.stack")
    assert out is model
    blocks = model.backbone.stack
    assert [is_checkpointed(b) for b in blocks] == [False, True, False]
    assert [is_compiled(b) for b in blocks] == [True, True, True]  # compile is per block, all of them
    assert set(model.state_dict()) == keys  # a user's checkpoint still loads


def test_apply_to_model_eager_checkpointing_keeps_the_maths():
    torch.manual_seed(0)
    model = make_llama()  # Llama-style: blocks at model.layers, found without block_path
    reference = copy.deepcopy(model)
    cpu_recipe(checkpoint_layers=(0,), compile_mode="none").apply_to_model(model)
    assert [is_checkpointed(b) for b in model.model.layers] == [True, False]
    assert not any(is_compiled(b) for b in model.model.layers)
    x = torch.randint(0, 300, (2, 16))
    y = torch.randint(0, 300, (2, 16))
    loss, ref = model(x, y), reference(x, y)
    loss.backward()
    ref.backward()
    assert torch.allclose(loss, ref)
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6)


def test_apply_to_model_block_beyond_the_model():
    with pytest.raises(UsageError, match="block 5 does not exist, the model has 2 blocks"):
        cpu_recipe(checkpoint_layers=(0, 5)).apply_to_model(make_llama())


def test_apply_to_model_moves_to_device_first():
    model = cpu_recipe().apply_to_model(nn.Sequential(nn.Linear(2, 2)), device="cpu")
    assert next(model.parameters()).device.type == "cpu"


def documents(count: int = 200, seed: int = 0, max_len: int = 65) -> list[list[int]]:
    """Item i counts up from 1000 * i: a label is its input + 1 wherever it is not a pad."""
    rng = np.random.default_rng(seed)
    return [list(range(1000 * i, 1000 * i + int(n))) for i, n in enumerate(rng.integers(2, max_len + 1, count))]


def test_dataloader_from_python_lists_respects_the_budget():
    docs = documents()
    recipe = cpu_recipe(token_budget=256)  # seq_len 64: the longest document's 65 tokens, inputs x[:-1]
    seen_tokens = 0
    for input_ids, labels in recipe.dataloader(docs):
        assert input_ids.dtype == labels.dtype == torch.int64
        assert input_ids.numel() <= 256 and input_ids.shape[1] <= 64
        real = labels != -100
        assert torch.equal(labels[real], input_ids[real] + 1)  # labels are x[1:], inputs x[:-1]
        # Right-padded: a row's labels are real up to its length, -100 after.
        first_pad = real.int().argmin(dim=1)
        for row, n in zip(real, first_pad):
            if not row.all():
                assert not row[n:].any()
        seen_tokens += int(real.sum())
    assert seen_tokens == sum(len(d) - 1 for d in docs)  # every item once per epoch


@pytest.mark.parametrize("kind", ["numpy", "tensor"])
def test_dataloader_accepts_arrays_and_tensors(kind):
    docs = documents(50)
    data = [np.asarray(d, dtype=np.int32) if kind == "numpy" else torch.tensor(d) for d in docs]
    batches = list(cpu_recipe(token_budget=128, batching="fixed").dataloader(data, seq_len=64))
    assert len(batches) == 50 // 2  # fixed: token_budget // seq_len = 2 sequences of 64 each
    assert all(x.shape == (2, 64) and x.dtype == torch.int64 for x, _ in batches)
    rows = [x[i][y[i] != -100].tolist() for x, y in batches for i in range(2)]
    assert sorted(rows) == sorted(d[:-1] for d in docs)  # every item once, its values intact


class CountingDataset:
    """Has `lengths`: the loader plans batches without reading an item."""

    def __init__(self, docs):
        self.docs = docs
        self.lengths = [len(d) for d in docs]
        self.reads = 0

    def __len__(self):
        return len(self.docs)

    def __getitem__(self, i):
        self.reads += 1
        return self.docs[i]


def test_dataloader_uses_lengths_without_reading():
    data = CountingDataset(documents(40))
    loader = cpu_recipe(token_budget=256).dataloader(data)
    assert data.reads == 0
    next(iter(loader))
    assert 0 < data.reads <= 256


def test_dataloader_refuses_items_longer_than_seq_len():
    """seq_len given (the default is the longest document, so only a given one or the model's
    context can be exceeded): a longer item is refused by its index in the dataset, short
    documents skipped before it included."""
    aligned = r"dataset item 2 has 100 tokens, more than seq_len 64 \+ 1 = 65; cut documents into pieces of at most 65"
    with pytest.raises(UsageError, match=aligned):
        cpu_recipe().dataloader([[1] * 65, [7], [1] * 100], seq_len=64)
    unshifted = r"dataset item 0 has 65 tokens, more than seq_len 64; cut documents into pieces of at most 64 tokens"
    with pytest.raises(UsageError, match=unshifted):
        cpu_recipe().dataloader([[1] * 65], seq_len=64, labels="unshifted")


def test_custom_collate_fn_is_used():
    received = []

    def collate(items):
        received.append(items)
        return {"n": len(items)}

    batch = next(iter(cpu_recipe(token_budget=256).dataloader(documents(20), collate_fn=collate)))
    assert isinstance(batch, dict) and batch["n"] == len(received[0])
    assert all(t.dtype == torch.int64 and t.dim() == 1 for t in received[0])


def test_wrapper_pickles_for_workers_and_runs_in_one():
    docs = documents(30)
    wrapped = pickle.loads(pickle.dumps(TokenSequences(docs, np.array([len(d) for d in docs]))))
    assert torch.equal(wrapped[3], torch.tensor(docs[3]))
    recipe = cpu_recipe(token_budget=256, num_workers=1, prefetch_factor=2)
    tokens = sum(int((y != -100).sum()) for _, y in recipe.dataloader(docs))
    assert tokens == sum(len(d) - 1 for d in docs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="pin_memory is kept where CUDA is")
def test_pin_memory_without_cuda_is_dropped_with_one_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = cpu_recipe(token_budget=256, pin_memory=True).dataloader(documents(20))
    assert [w.category for w in caught] == [RecipeEnvironmentWarning]
    assert loader.pin_memory is False
    next(iter(loader))


def test_autocast_bfloat16_on_cpu():
    layer = nn.Linear(8, 8)
    x = torch.randn(2, 8)
    with cpu_recipe(amp_dtype="bfloat16").autocast("cpu"):
        assert layer(x).dtype == torch.bfloat16
    # Without a device type it autocasts on this machine's device: the layer and its input
    # live there (on a CUDA machine a CPU layer given a CUDA input would fail on the device
    # mismatch, not on what this checks), and only that device's autocast makes bfloat16.
    here = "cuda" if torch.cuda.is_available() else "cpu"
    layer_here, x_here = nn.Linear(8, 8).to(here), x.to(here)
    with cpu_recipe(amp_dtype="bfloat16").autocast():
        out = layer_here(x_here)
        assert out.device.type == here and out.dtype == torch.bfloat16
    with cpu_recipe(amp_dtype="float32").autocast("cpu"):
        assert layer(x).dtype == torch.float32


def test_autocast_forces_the_sdpa_backend():
    q = torch.randn(1, 2, 8, 16)
    with cpu_recipe(sdpa_backend="math").autocast("cpu"):
        assert torch.backends.cuda.math_sdp_enabled()
        assert not torch.backends.cuda.flash_sdp_enabled()
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert torch.backends.cuda.flash_sdp_enabled()  # restored on exit


@pytest.mark.parametrize("dtype,enabled", [("float16", True), ("bfloat16", False), ("float32", False), ("tf32", False)])
def test_grad_scaler_only_for_float16(dtype, enabled):
    assert cpu_recipe(amp_dtype=dtype).grad_scaler("cpu").is_enabled() is enabled


@pytest.mark.process
def test_example_script_trains_an_hf_gpt2_on_a_cpu_recipe(recipe, tmp_path):
    """examples/train_gpt2.py, three steps, with a recipe measured here given the knobs CPU
    searches choose (flash attention, the chunked loss, packed batches), on `--model
    hf:gpt2-tiny`: the first step failed with "No available kernel" (GPT-2's attention
    dropout), and before that apply_to_model refused the chunked loss. (autotune's own GPT
    runs the same lines of the script in tests/examples/test_readme_snippets.py.)"""
    cpu = recipe.config.replace(sdpa_backend="flash", loss_impl="chunked", batching="packed")
    path = save_recipe(dataclasses.replace(recipe, config=cpu), tmp_path / "r.json")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train_gpt2.py"), "--steps", "3", "--recipe", str(path)]
        + ["--device", "cpu", "--model", "hf:gpt2-tiny"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    steps = [line for line in proc.stdout.splitlines() if line.startswith("step")]
    assert len(steps) == 3 and all("loss" in line for line in steps)
    assert "attention dropout 0.1 of GPT2LMHeadModel turned off" in proc.stderr  # said, once
    assert proc.stderr.count("attention dropout") == 1


@pytest.mark.slow
def test_a_document_mask_recipe_feeds_the_model_its_document_ids():
    """attention_mask=document with `for_model=` (the README loop): batches carry the
    `document_ids` the model's forward takes (they were (window, ids) pairs the collate could
    not pad: a TypeError); a model whose forward takes none is told so in one line."""
    from autotune.config import TrainConfig
    from autotune.model.load import build_model
    from autotune.recipe import Recipe

    recipe = Recipe(config=TrainConfig(batching="packed", attention_mask="document", token_budget=4 * 128))
    docs = [[1 + (i * 7 + j) % 300 for j in range(40)] for i in range(100)]
    model = build_model("gpt2-tiny")
    batch = next(iter(recipe.dataloader(docs, for_model=model)))
    assert set(batch) == {"input_ids", "labels", "document_ids"}
    assert batch["document_ids"].shape == batch["input_ids"].shape == (4, 128)
    assert (batch["document_ids"][:, 0] == 0).all() and (batch["document_ids"].diff(dim=1) >= 0).all()
    with torch.no_grad():  # FlexAttention runs forward on a CPU (its backward is CUDA's)
        assert torch.isfinite(model(**batch))
    with pytest.raises(UsageError, match="document needs a model whose forward takes document_ids"):
        recipe.dataloader(docs, for_model=make_llama())
