"""What a recipe that forces an SDPA kernel assumes of the model it is applied to, made so by
`apply_to_model` (and by every trial, through the same hook) or refused in one line:

- the model's attention runs through scaled_dot_product_attention (a Hugging Face model loaded
  with attn_implementation="eager" is switched to "sdpa": the same maths; one that runs
  another kernel is refused, or the forced backend would silently not take effect);
- on a CPU, flash runs no attention dropout: a model with some (Hugging Face GPT-2's 0.1) had
  its first training step fail with "No available kernel"; its attention dropout is turned off,
  said in one warning, as the recipe was measured (autotune's GPT has none)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from autotune.config import RunSpec, TrainConfig
from autotune.errors import RecipeModelWarning, UnsupportedConfig
from autotune.knobs.apply import Where
from autotune.knobs.attention import apply_attention_knob
from autotune.measure import outcomes
from autotune.measure.loop import measure
from autotune.model.load import build_model
from autotune.recipe import Recipe
from tests.helpers import HF

pytestmark = HF

FLASH = TrainConfig(sdpa_backend="flash")


def attention_dropouts(model: nn.Module) -> list[float]:
    values = []
    for module in model.modules():
        for name in ("attn_dropout", "attention_dropout"):
            value = getattr(module, name, None)
            if isinstance(value, nn.Dropout):
                values.append(value.p)
            elif isinstance(value, float):
                values.append(value)
    return values


def train_step(recipe: Recipe, model: nn.Module) -> torch.Tensor:
    x = torch.randint(1, 256, (2, 32))
    model.train()
    with recipe.autocast("cpu"):
        loss = model(input_ids=x, labels=x).loss
    loss.backward()
    return loss


@pytest.mark.parametrize("name", ["hf:gpt2-tiny", "hf:llama-tiny"])
def test_flash_on_a_cpu_turns_the_attention_dropout_off_and_says_so(name):
    model = build_model(name)
    if name == "hf:llama-tiny":  # Llama's default is 0.0: give it some, as a fine-tuning config would
        for layer in model.model.layers:
            layer.self_attn.attention_dropout = 0.1
    assert set(attention_dropouts(model)) == {0.1}
    others = [m.p for m in model.modules() if isinstance(m, nn.Dropout) and m.p and m not in _attn(model)]
    recipe = Recipe(config=FLASH)
    with pytest.warns(RecipeModelWarning) as caught:
        recipe.apply_to_model(model, device="cpu")
    (warning,) = caught
    assert str(warning.message).startswith(f"attention dropout 0.1 of {type(model).__name__} turned off: ")
    assert "flash" in str(warning.message) and "sdpa_backend=auto" in str(warning.message)
    assert set(attention_dropouts(model)) == {0.0}
    # Residual and embedding dropout are not the kernel's business: they stay.
    assert [m.p for m in model.modules() if isinstance(m, nn.Dropout) and m.p and m not in _attn(model)] == others
    assert torch.isfinite(train_step(recipe, model))  # it failed: "No available kernel"


def _attn(model: nn.Module) -> list[nn.Module]:
    """The attention modules' own nn.Dropout (GPT-2's attn_dropout)."""
    return [m.attn_dropout for m in model.modules() if isinstance(getattr(m, "attn_dropout", None), nn.Module)]


def test_what_the_kernel_can_run_is_left_alone():
    for cfg, kind in ((TrainConfig(), "cpu"), (TrainConfig(sdpa_backend="math"), "cpu"), (FLASH, "cuda")):
        model = build_model("hf:gpt2-tiny")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            apply_attention_knob(model, cfg, Where(None, kind))  # CUDA's flash runs dropout
        assert set(attention_dropouts(model)) == {0.1}


class NanoAttention(nn.Module):
    """nanoGPT's attention: its dropout is a float passed to scaled_dot_product_attention."""

    def __init__(self) -> None:
        super().__init__()
        self.c_attn = nn.Linear(16, 48)
        self.dropout = 0.2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.c_attn(x).unsqueeze(1).split(16, dim=-1)
        p = self.dropout if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True).squeeze(1)


def test_a_nanogpt_style_attention_dropout_is_found_too():
    model = nn.Sequential(NanoAttention())
    with pytest.warns(RecipeModelWarning, match="attention dropout 0.2 of Sequential turned off"):
        apply_attention_knob(model, FLASH, Where(None, "cpu"))
    assert model[0].dropout == 0.0
    with Recipe(config=FLASH).autocast("cpu"):
        model(torch.randn(2, 8, 16)).sum().backward()


def test_an_eager_hf_model_is_switched_to_sdpa_and_another_kernel_refused():
    model = build_model("hf:gpt2-tiny")
    model.set_attn_implementation("eager")
    with pytest.warns(RecipeModelWarning, match="GPT2LMHeadModel's attention switched from eager to sdpa"):
        apply_attention_knob(model, TrainConfig(sdpa_backend="math"), Where(None, "cpu"))
    assert model.config._attn_implementation == "sdpa"
    model.config._attn_implementation = "flex_attention"  # as loaded with attn_implementation="flex_attention"
    with pytest.raises(UnsupportedConfig, match='runs attn_implementation="flex_attention"'):
        apply_attention_knob(model, TrainConfig(sdpa_backend="math"), Where(None, "cpu"))


@pytest.mark.slow
def test_the_search_measures_the_checklist_on_an_hf_gpt2():
    """The checklist's flash trial of `search --model hf:gpt2-tiny` on a CPU was `unsupported`
    ("No available kernel"): it is measured, on the model the recipe will train."""
    spec = RunSpec(model="hf:gpt2-tiny", device="cpu", steps=2, warmup=1, min_time_s=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecipeModelWarning)
        m = measure(spec, TrainConfig(sdpa_backend="flash", token_budget=1024))
    assert m.outcome == outcomes.OK, m.reason
