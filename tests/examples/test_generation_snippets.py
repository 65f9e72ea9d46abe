"""docs/generation.md's snippets run as printed (examples/readme_snippets.md holds each block):
a generation recipe applied to autotune's GPT and to a transformers model, whose own generate
then gives the same tokens."""

from __future__ import annotations

import pytest
import torch

from autotune.config import GenerateConfig
from autotune.model.decode import full_recompute_greedy
from autotune.model.load import build_model
from autotune.recipe import Recipe
from tests.examples.test_readme_snippets import assert_printed_as_it_runs, run, snippet

PROMPTS = [[5, 6, 7, 8, 9], [1, 2, 3]]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Recipe(
        config=GenerateConfig(kv_cache="static", batch_size=2, prompt_bucket=16),
        model={"name": "gpt2-tiny"},
        hardware={"kind": "cpu", "name": "a CPU"},
        task="generate",
        workload={"prompt_lens": [5], "new_tokens": 6},
    ).save(tmp_path / "recipes" / "gpt2-generate-nvidia-h200.json")
    return tmp_path


@pytest.mark.parametrize("name", ["gpt2-tiny", "hf:gpt2-tiny"])
@pytest.mark.slow
def test_the_generation_snippets_run_as_written(name, workdir):
    torch.manual_seed(0)
    model = build_model(name).eval()
    reference = [full_recompute_greedy(model, p, 6) for p in PROMPTS] if name == "gpt2-tiny" else None
    ns = run(snippet("Applying a generation recipe"), model=model, device="cpu", prompts=PROMPTS)
    assert len(ns["tokens"]) == 2 and all(len(t) == 6 for t in ns["tokens"])
    if reference is not None:
        assert ns["tokens"] == reference
        return
    ids = torch.tensor([PROMPTS[0]])
    out = run(snippet("With Hugging Face generate"), model=model, tuned=ns["tuned"], input_ids=ids,
              attention_mask=torch.ones_like(ids))["output"]  # fmt: skip
    assert out[0, ids.shape[1] :].tolist() == ns["tokens"][0]


@pytest.mark.parametrize("section", ["Applying a generation recipe", "With Hugging Face generate"])
def test_the_docs_print_each_generation_block_as_it_runs_here(section):
    assert_printed_as_it_runs(section)
