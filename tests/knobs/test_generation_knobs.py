"""Every generation knob changes what runs (each test fails if its knob stops taking effect), and
the device rules refuse what a CPU cannot run, with the reason."""

from __future__ import annotations

import pkgutil

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend
from torch.utils._python_dispatch import TorchDispatchMode

from autotune import registry
from autotune.config import GenerateConfig, GenerateSpec
from autotune.errors import UnsupportedConfig, UsageError
from autotune.knobs import generation as knobs
from autotune.knobs.support import DeviceCapabilities, check_model_supported, check_supported
from autotune.measure.generation import workload_batches
from autotune.model.decode import left_pad
from autotune.model.load import build_model

CPU = DeviceCapabilities("cpu", None, has_triton=False, cpu_bf16=True)
NEW = 6


def decoder(cfg: GenerateConfig, max_len: int = 32):
    torch.manual_seed(0)
    return knobs.gpt_decoder(build_model("gpt2-tiny"), cfg, max_len=max_len)


def prompts(n: int = 1, length: int = 8):
    return left_pad([list(range(1, length + 1))] * n)


def attention_key_lengths(monkeypatch) -> list[int]:
    seen: list[int] = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, **kwargs):
        seen.append(k.shape[2])
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return seen


def test_kv_cache_static_attends_over_the_whole_preallocated_cache_dynamic_over_what_grew(monkeypatch):
    seen = attention_key_lengths(monkeypatch)
    decoder(GenerateConfig(kv_cache="static"), max_len=20).generate(prompts(), NEW)
    layers = 2
    decode = seen[layers:]  # after prefill's (which attends among the prompt's 8 tokens)
    assert seen[:layers] == [8, 8] and set(decode) == {20}
    seen.clear()
    decoder(GenerateConfig(kv_cache="dynamic"), max_len=20).generate(prompts(), NEW)
    assert seen[layers:] == [n for n in range(9, 8 + NEW) for _ in range(layers)]


def test_decode_compile_and_compile_prefill_compile_what_they_say(monkeypatch):
    compiled: list[tuple[str, str]] = []

    def spy(fn, **kwargs):
        compiled.append((fn.__name__, kwargs["mode"]))
        return fn

    monkeypatch.setattr(knobs.torch, "compile", spy)
    knobs.gpt_decoder(build_model("gpt2-tiny"), GenerateConfig(decode_compile="default"), max_len=16)
    assert compiled == [("decode_step", "default")]
    compiled.clear()
    cfg = GenerateConfig(decode_compile="max-autotune-no-cudagraphs", compile_prefill=True, kv_cache="static")
    knobs.gpt_decoder(build_model("gpt2-tiny"), cfg, max_len=16)
    assert sorted(compiled) == [
        ("decode_step", "max-autotune-no-cudagraphs"),
        ("prefill", "max-autotune-no-cudagraphs"),
    ]
    compiled.clear()
    knobs.gpt_decoder(build_model("gpt2-tiny"), GenerateConfig(), max_len=16)
    assert compiled == []


class FlashCalls(TorchDispatchMode):
    """Counts attention calls that run the flash kernel (the one SDPA's dispatch picks for these
    inputs under the flags in force), per phase: the decoder's marks separate them."""

    def __init__(self) -> None:
        super().__init__()
        self.phases: list[int] = [0]

    def mark(self) -> None:
        self.phases.append(0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.scaled_dot_product_attention.default:
            q, k, v, mask, *_ = (*args, None)
            chosen = torch._fused_sdp_choice(
                q, k, v, kwargs.get("attn_mask", mask), 0.0, kwargs.get("is_causal", False)
            )
            self.phases[-1] += chosen == SDPBackend.FLASH_ATTENTION.value
        return func(*args, **kwargs)


@pytest.mark.parametrize("prefill, decode", [("flash", "math"), ("math", "flash")])
def test_prefill_sdpa_and_decode_sdpa_force_their_own_phase(prefill, decode):
    calls = FlashCalls()
    cfg = GenerateConfig(prefill_sdpa=prefill, decode_sdpa=decode)
    gen = decoder(cfg)
    with calls:
        gen.generate(prompts(), NEW, calls.mark)
    _, in_prefill, *in_decode, _ = calls.phases  # nothing runs before the first mark nor after the last
    assert in_prefill == (2 if prefill == "flash" else 0)  # one attention a layer
    assert in_decode == ([2] * (NEW - 1) if decode == "flash" else [0] * (NEW - 1))


def test_dtype_casts_the_weights_and_the_cache():
    gen = decoder(GenerateConfig(dtype="bfloat16", kv_cache="static"))
    assert {p.dtype for p in gen.model.parameters()} == {torch.bfloat16}
    assert {k.dtype for k in gen.cache.keys} == {torch.bfloat16}
    assert decoder(GenerateConfig()).cache.__class__.__name__ == "DynamicCache"


def test_batch_size_and_prompt_bucket_shape_the_batches_and_the_cache():
    spec = GenerateSpec(prompt_lens=(5, 9, 12), new_tokens=4)
    batches = workload_batches(spec, batch_size=3, bucket=16, vocab_size=320)
    assert {tuple(b.ids.shape) for b in batches} == {(3, 16)}
    unbucketed = workload_batches(spec, batch_size=1, bucket=1, vocab_size=320)
    assert {b.ids.shape[0] for b in unbucketed} == {1} and {b.width for b in unbucketed} == {5, 9, 12}
    gen = decoder(GenerateConfig(batch_size=3, kv_cache="static"), max_len=20)
    assert gen.cache.keys[0].shape[0] == 3
    assert gen.generate(batches[0], 4).shape == (3, 4)


def test_cuda_graph_modes_are_refused_on_a_cpu_with_their_reason():
    with pytest.raises(UnsupportedConfig, match="reduce-overhead means CUDA graphs, which need a CUDA device"):
        check_supported(GenerateConfig(kv_cache="static", decode_compile="reduce-overhead"), CPU)
    for backend in ("efficient", "cudnn"):
        with pytest.raises(UnsupportedConfig, match="CUDA kernel"):
            check_supported(GenerateConfig(decode_sdpa=backend), CPU)
    check_supported(GenerateConfig(kv_cache="static", decode_compile="default"), CPU)  # inductor runs on a CPU


def test_knob_rules_refuse_what_cannot_go_together_in_one_line():
    with pytest.raises(UsageError, match="one graph per length"):
        GenerateConfig(decode_compile="reduce-overhead")  # a dynamic cache
    with pytest.raises(UsageError, match="set a decode_compile other than none"):
        GenerateConfig(compile_prefill=True)
    cuda = DeviceCapabilities("cuda", (9, 0), has_triton=True)
    with pytest.raises(UnsupportedConfig, match="flash attention takes no mask"):
        check_supported(GenerateConfig(kv_cache="static", decode_sdpa="flash", dtype="bfloat16"), cuda)


@pytest.mark.slow
def test_a_transformers_model_is_refused_what_generate_cannot_do():
    model = build_model("hf:gpt2-tiny")
    check_model_supported(model, GenerateConfig(kv_cache="static", decode_compile="default"))
    refused = {
        "compile_prefill": GenerateConfig(kv_cache="static", decode_compile="default", compile_prefill=True),
        "decode_compile": GenerateConfig(decode_compile="default"),
        "prefill_sdpa": GenerateConfig(prefill_sdpa="math"),
    }
    for knob, cfg in refused.items():
        with pytest.raises(UnsupportedConfig) as raised:
            check_model_supported(model, cfg)
        assert raised.value.knob == knob and "\n" not in str(raised.value)


def test_a_model_that_cannot_use_a_static_cache_is_refused_in_one_line():
    class OwnCache:  # a transformers model keeping a cache of its own (xlnet, rwkv, ...)
        def generate(self): ...

        def _valid_auto_compile_criteria(self): ...

        def _supports_default_dynamic_cache(self):
            return False

    with pytest.raises(UnsupportedConfig, match="OwnCache keeps a cache of its own.*cannot use a static cache"):
        check_model_supported(OwnCache(), GenerateConfig(kv_cache="static"))
    check_model_supported(OwnCache(), GenerateConfig())  # its dynamic cache is its own: fine


def test_every_generation_knob_says_where_it_takes_effect_and_that_place_exists():
    for knob in registry.knobs_of(registry.GENERATE):
        assert callable(pkgutil.resolve_name(knob.applied)), knob.name


def test_a_transformers_models_cache_and_compile_are_generates_own(monkeypatch):
    """kv_cache=static gives generate's forward a StaticCache; decode_compile=MODE has generate
    compile its decode forward with MODE (its get_compiled_call, spied: no inductor here; on a CPU
    only because the config says `_compile_all_devices`); decode_compile=none compiles nothing."""
    from transformers import StaticCache

    from autotune.knobs.hf_generation import HfGenerator

    torch.manual_seed(0)
    model = build_model("hf:gpt2-tiny").eval()
    caches: list[type] = []
    model.register_forward_pre_hook(
        lambda module, args, kwargs: caches.append(type(kwargs.get("cache") or kwargs.get("past_key_values"))),
        with_kwargs=True,
    )
    compiled: list[str] = []

    def spy(compile_config):
        compiled.append(compile_config.mode)
        return model.__call__

    monkeypatch.setattr(model, "get_compiled_call", spy)
    HfGenerator(model, GenerateConfig(kv_cache="static", decode_compile="default")).generate(prompts(), 3)
    assert set(caches) == {StaticCache} and compiled == ["default"]
    caches.clear(), compiled.clear()
    HfGenerator(model, GenerateConfig(kv_cache="static")).generate(prompts(), 3)
    assert set(caches) == {StaticCache} and compiled == []
    caches.clear()
    HfGenerator(model, GenerateConfig()).generate(prompts(), 3)
    assert StaticCache not in caches


def test_the_docs_generation_knob_table_is_the_registrys():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "generation.md").read_text(encoding="utf-8")
    start, end = text.index("<!-- generate-knobs:start -->\n"), text.index("<!-- generate-knobs:end -->")
    table = text[start + len("<!-- generate-knobs:start -->\n") : end].strip()
    assert table == registry.markdown_table(registry.GENERATE)
