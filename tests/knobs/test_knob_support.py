"""What a device and a model can run with the new knobs: rejected before anything runs,
with the reason, as `unsupported`."""

from __future__ import annotations

import pytest
import torch

from autotune.config import RunSpec, TrainConfig
from autotune.errors import UnsupportedConfig
from autotune.knobs.compile import head_is_compiled, is_compiled
from autotune.knobs.support import DeviceCapabilities, check_model_supported, check_supported
from autotune.measure.loop import measure
from autotune.model import build_model, find_blocks
from autotune.recipe.recipe import Recipe
from tests.fixture_models import make_llama

CPU = DeviceCapabilities("cpu")
H100 = DeviceCapabilities("cuda", (9, 0), has_triton=True)
DOCUMENT = TrainConfig(batching="packed", attention_mask="document")


def reason(cfg: TrainConfig, caps: DeviceCapabilities) -> str | None:
    try:
        check_supported(cfg, caps)
    except UnsupportedConfig as exc:
        return str(exc)
    return None


def test_cpu_rejects_document_masks_and_the_cuda_allocator():
    assert reason(DOCUMENT, CPU) == (
        "attention_mask: document masks run on FlexAttention, which has no backward on CPU in torch 2.13 "
        "(and torch's variable-length attention is CUDA-only): they train on CUDA"
    )
    assert reason(TrainConfig(expandable_segments=True), CPU) == (
        "expandable_segments: a setting of the CUDA caching allocator; CPU tensors do not use it"
    )
    for ok in (TrainConfig(loss_impl="chunked"), TrainConfig(compile_mode="default", compile_scope="model")):
        assert reason(ok, CPU) is None


@pytest.mark.skipif(
    torch.__version__ < (2, 13),
    reason=f"torch {torch.__version__} runs FlexAttention unfused on CPU, backward included: the rule, made for "
    "torch 2.13, is only conservative there",
)
def test_cpu_flex_attention_really_has_no_backward():
    """The CPU rule above is what torch 2.13 does; when it changes, this fails first."""
    from torch.nn.attention.flex_attention import flex_attention

    q = torch.randn(1, 1, 16, 8, requires_grad=True)
    with pytest.raises(NotImplementedError, match="FlexAttention does not support backward on CPU"):
        flex_attention(q, q, q)


def test_cuda_runs_them_with_triton_only():
    assert reason(DOCUMENT, H100) is None
    assert reason(TrainConfig(expandable_segments=True), H100) is None
    assert reason(DOCUMENT, DeviceCapabilities("cuda", (9, 0), has_triton=False)) == (
        "attention_mask: document masks run on FlexAttention, compiled with triton, which is not installed"
    )


def test_our_gpt_has_every_seam():
    cfg = DOCUMENT.replace(compile_mode="default", compile_scope="blocks+head", loss_impl="chunked")
    check_model_supported(build_model("gpt2-tiny"), cfg)


@pytest.mark.parametrize(
    "knobs, message",
    [
        (
            {"compile_mode": "default", "compile_scope": "blocks+head"},
            "compile_scope: blocks+head cannot find the head of LlamaLike: it compiles a head_loss(hidden, labels) "
            "method (final norm, output projection and loss; autotune's GPT has one); use compile_scope=blocks "
            "or model",
        ),
        (
            {"batching": "packed", "attention_mask": "document"},
            "attention_mask: document needs a model whose forward takes document_ids (autotune's GPT does); "
            "LlamaLike.forward does not",
        ),
    ],
)
def test_a_user_model_without_the_seam_is_unsupported_before_anything_changes(knobs, message):
    model = make_llama()
    cfg = TrainConfig(checkpoint_layers=(0,), **knobs)
    with pytest.raises(UnsupportedConfig) as info:
        Recipe(config=cfg).apply_to_model(model)  # the user's path
    assert str(info.value) == message
    # Nothing was applied: no block checkpointed or compiled, the forward untouched.
    assert all("forward" not in block.__dict__ and not is_compiled(block) for block in find_blocks(model))
    assert not head_is_compiled(model)


@pytest.mark.slow
def test_a_user_model_takes_the_scopes_that_need_no_seam(aot_eager):  # nothing runs: no inductor
    for scope in ("blocks", "model"):
        model = make_llama()
        Recipe(config=TrainConfig(compile_mode="default", compile_scope=scope)).apply_to_model(model)
        assert is_compiled(model) == (scope == "model")
        assert all(is_compiled(b) for b in find_blocks(model)) == (scope == "blocks")


def test_measure_records_unsupported_with_the_reason():
    spec = RunSpec(model="tests.fixture_models:make_llama", device="cpu", warmup=1, steps=2, min_time_s=0)
    m = measure(spec, TrainConfig(compile_mode="default", compile_scope="blocks+head"))
    assert m.outcome == "unsupported" and m.reason.startswith("compile_scope: blocks+head cannot find the head")
    m = measure(RunSpec(model="gpt2-tiny", device="cpu", warmup=1, steps=2, min_time_s=0), DOCUMENT)
    assert m.outcome == "unsupported" and m.reason.startswith("attention_mask: document masks run on FlexAttention")
