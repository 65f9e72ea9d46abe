"""TF32 is a setting of the whole step: forward, backward (two thirds of the FLOPs), the
optimizer and the backward graph compile generates lazily, in the measuring loop and in
what a recipe sets up for a user; a float32 run is true float32 throughout."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_full_backward_hook
from torch.optim.optimizer import register_optimizer_step_pre_hook

from autotune.config import RunSpec, TrainConfig
from autotune.measure.loop import measure
from autotune.model.load import build_model
from autotune.recipe.recipe import Recipe
from tests.cuda_fakes import fake_gpu_machine

# The spy's backward hooks see the embedding's output, whose input needs no grad: torch says so.
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")


def tf32_now() -> bool:
    """Whether float32 matmuls on CUDA run in TF32, whichever API set it."""
    if torch.backends.cuda.matmul.fp32_precision == "tf32":
        return True
    try:
        return bool(torch.backends.cuda.matmul.allow_tf32)
    except RuntimeError:  # new and legacy APIs mixed: the new one's answer stands
        return False


@pytest.fixture(autouse=True)
def restore_precision():
    """These tests change process-wide precision flags: put them back."""
    matmul = torch.get_float32_matmul_precision()
    legacy_cudnn = torch.backends.cudnn.allow_tf32
    cudnn = {op: getattr(torch.backends.cudnn, op).fp32_precision for op in ("conv", "rnn")}
    yield
    torch.set_float32_matmul_precision(matmul)
    torch.backends.cudnn.allow_tf32 = legacy_cudnn
    for op, value in cudnn.items():
        getattr(torch.backends.cudnn, op).fp32_precision = value


@contextlib.contextmanager
def precision_spy():
    """What TF32 is in each phase of every training step: forward (module hooks), backward
    (full backward hooks) and the optimizer step (its pre-hook)."""
    seen: dict[str, set[bool]] = {"forward": set(), "backward": set(), "optimizer": set()}
    handles = []
    try:
        handles.append(register_module_forward_hook(lambda *_: seen["forward"].add(tf32_now())))
        handles.append(register_module_full_backward_hook(lambda *_: seen["backward"].add(tf32_now())))
        handles.append(register_optimizer_step_pre_hook(lambda *_: seen["optimizer"].add(tf32_now())))
        yield seen
    finally:
        for handle in handles:
            handle.remove()


@pytest.mark.cuda_fakes
@pytest.mark.parametrize("amp_dtype, expected, before", [("tf32", True, False), ("float32", False, True)])
def test_the_measuring_loop_sets_tf32_for_the_whole_step(monkeypatch, amp_dtype, expected, before):
    torch.set_float32_matmul_precision("high" if before else "highest")  # what the caller had
    with fake_gpu_machine(monkeypatch), precision_spy() as seen:
        m = measure(
            RunSpec(model="gpt2-tiny", device="cuda:0", steps=2, warmup=0, min_time_s=0),
            TrainConfig(amp_dtype=amp_dtype, token_budget=256, batching="fixed"),
        )
    assert m.outcome == "ok", m.reason
    assert seen == {"forward": {expected}, "backward": {expected}, "optimizer": {expected}}
    assert tf32_now() is before  # the caller's setting is back
    assert torch.get_float32_matmul_precision() == ("high" if before else "highest")  # inductor still reads it


def test_a_tf32_recipe_keeps_tf32_in_the_users_backward_and_optimizer_step():
    """README's training loop: autocast around the forward only; backward and the optimizer
    step after it must run in TF32 too."""
    recipe = Recipe(config=TrainConfig(amp_dtype="tf32"), model={"name": "gpt2-tiny", "seq_len": 128})
    model = recipe.apply_to_model(build_model("gpt2-tiny"))
    optimizer = torch.optim.AdamW(model.parameters())
    x = torch.randint(0, 320, (2, 128))
    with precision_spy() as seen:
        with recipe.autocast("cpu"):
            loss = model(x, x)
        loss.backward()
        optimizer.step()
    assert seen == {"forward": {True}, "backward": {True}, "optimizer": {True}}
    assert torch.get_float32_matmul_precision() == "high"  # the API inductor reads, consistent with the new one
    assert torch.backends.cudnn.conv.fp32_precision == torch.backends.cudnn.rnn.fp32_precision == "tf32"


@pytest.mark.parametrize("amp_dtype", ["float32", "tf32", "bfloat16"])
def test_the_legacy_tf32_flags_stay_readable_while_and_after_the_knob_applies(amp_dtype):
    """Inductor's convolution lowering reads the legacy `torch.backends.cudnn.allow_tf32`,
    which raises ("a mix of the legacy and new APIs") when cuDNN's per-op flags and the legacy
    one disagree: cuDNN conv set to "ieee" through the new API with the legacy flag left True
    did that in every run but tf32 ones. Both APIs must say the same thing, and the caller's
    settings come back."""
    from autotune.knobs.precision import fp32_precision

    torch.backends.cudnn.allow_tf32 = True  # torch's defaults: TF32 convolutions, IEEE matmuls
    torch.set_float32_matmul_precision("highest")
    tf32 = amp_dtype == "tf32"
    with fp32_precision(amp_dtype):
        assert torch.backends.cudnn.allow_tf32 is tf32
        assert torch.backends.cudnn.conv.fp32_precision == torch.backends.cudnn.rnn.fp32_precision
        assert (torch.backends.cudnn.conv.fp32_precision == "tf32") is tf32
        assert torch.backends.cuda.matmul.allow_tf32 is tf32
        assert torch.get_float32_matmul_precision() == ("high" if tf32 else "highest")
    assert torch.backends.cudnn.allow_tf32 is True
    assert torch.backends.cudnn.conv.fp32_precision == torch.backends.cudnn.rnn.fp32_precision == "tf32"
    assert torch.get_float32_matmul_precision() == "highest" and torch.backends.cuda.matmul.allow_tf32 is False
