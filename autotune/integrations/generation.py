"""A generation recipe in the words of the code that generates: Hugging Face `generate` (its
GenerationConfig fields, the compile settings and the lines around them: `hf-generate`, and as
data `hf-generate-json`), and a plain PyTorch decode loop over a transformers model, the loop
`generate` runs written out (`decode-loop`).

The fields come from each knob's mapping in the registry (`model.generation_fields`), the same
the measured run passed to `generate`; `checked_generation_config` builds the installed
transformers' GenerationConfig from them, so a field it does not know fails here, not in the
user's script. What GenerationConfig cannot express (the dtype, the batch size, the prompt
padding, a forced attention kernel) is said in comments, and done in the decode loop. Every value
written into the code goes through one quoting function of `integrations.common` (a recipe's
text fields are its author's, and must never become code: issue D, X01/X02)."""

from __future__ import annotations

import importlib.util
import json
from typing import Any

from autotune.config import SDPA_KERNELS, is_finite_number
from autotune.integrations.common import comment, python_literal, python_name
from autotune.model.generation_fields import generation_config_fields, generation_notes
from autotune.recipe.recipe import Recipe


def fields(recipe: Recipe) -> dict[str, Any]:
    """The GenerationConfig fields of the recipe (compile settings as CompileConfig's arguments)."""
    return generation_config_fields(recipe.config.to_dict(), int(recipe.workload["new_tokens"]))


def checked_generation_config(recipe: Recipe) -> tuple[dict[str, Any], str]:
    """The fields, and how they were checked: by building the installed transformers'
    GenerationConfig (and CompileConfig) from them, where transformers is installed."""
    values = fields(recipe)
    if importlib.util.find_spec("transformers") is None:
        return values, "transformers is not installed here: the fields are not checked against it"
    import transformers
    from transformers import CompileConfig, GenerationConfig

    compile_args = values.get("compile_config")
    GenerationConfig(**{**values, "compile_config": CompileConfig(**compile_args) if compile_args else None})
    return values, f"checked against transformers {transformers.__version__} (GenerationConfig built from them)"


def _header(recipe: Recipe, what: str, checked: str) -> list[str]:
    g = recipe.measured.get("generation") or {}
    tps = recipe.measured.get("tokens_per_sec")
    latency = g.get("token_latency_p50_s")  # the loader checks only that `generation` is a mapping
    latency = latency if is_finite_number(latency) else 0
    lines = [f"{what} for the autotune generation recipe of {recipe.model.get('name') or 'the model'}"]
    if tps:
        lines.append(
            f"measured at {tps:,.0f} output tokens/s (batch {recipe.config.batch_size}), time per token p50 "
            f"{1000 * latency:.2f} ms, on {recipe.hardware.get('name', '?')}"
        )
    if recipe.study.get("name"):
        lines.append(f"study {recipe.study['name']}, trial {recipe.study.get('trial')}")
    return [comment(line) for line in [*lines, checked]]


def _sdpa_import(backends: set[str]) -> list[str]:
    return ["from torch.nn.attention import SDPBackend, sdpa_kernel"] if backends - {"auto"} else []


def _kernel(backend: str) -> str:
    return f"[SDPBackend.{python_name(SDPA_KERNELS[backend])}]"


def hf_generate(recipe: Recipe) -> str:
    """`hf-generate`: GenerationConfig and the generate call, as Python to paste."""
    values, checked = checked_generation_config(recipe)
    cfg = recipe.config
    lines = _header(recipe, "Hugging Face generate", checked)
    lines += [comment("Use: model.generate(**inputs, generation_config=generation_config)"), ""]
    lines += ["import torch"] + _sdpa_import({cfg.decode_sdpa})
    lines += ["from transformers import CompileConfig, GenerationConfig", ""]
    if cfg.dtype != "float32":
        why = comment(f"as measured: the weights and the cache in {cfg.dtype}")
        lines += [f"model = model.to(torch.{python_name(cfg.dtype)})  {why}"]
    lines.append("generation_config = GenerationConfig(")
    for key, value in values.items():
        shown = f"CompileConfig(**{python_literal(value)})" if key == "compile_config" else python_literal(value)
        lines.append(f"    {python_name(key)}={shown},")
    lines += [")", ""]
    lines.append(
        comment(
            f"{cfg.batch_size} prompt(s) a call, left-padded"
            + (f" to a multiple of {cfg.prompt_bucket} tokens" if cfg.prompt_bucket > 1 else "")
            + ":"
        )
    )
    pad = f", pad_to_multiple_of={cfg.prompt_bucket}" if cfg.prompt_bucket > 1 else ""
    lines.append(comment(f'inputs = tokenizer(prompts, return_tensors="pt", padding=True{pad}, padding_side="left")'))
    call = "output = model.generate(**inputs, generation_config=generation_config)"
    if cfg.decode_sdpa != "auto":
        lines += [f"with sdpa_kernel({_kernel(cfg.decode_sdpa)}):", f"    {call}"]
    else:
        lines.append(call)
    notes = generation_notes(cfg.to_dict())
    if cfg.prefill_sdpa != cfg.decode_sdpa:
        notes.append(
            f"The recipe runs prefill under {cfg.prefill_sdpa} attention and decode under {cfg.decode_sdpa}: one "
            "generate call runs one backend (the decode one, above); `--format decode-loop` keeps both."
        )
    if notes:
        lines += ["", comment("What GenerationConfig cannot express (done above where code can):")]
        lines += [comment(f"- {note}") for note in notes]
    return "\n".join(lines) + "\n"


def hf_generate_json(recipe: Recipe) -> str:
    """`hf-generate-json`: the fields as data, with what they cannot express."""
    values, _ = checked_generation_config(recipe)
    cfg = recipe.config
    data = {
        "generation_config": values,
        "dtype": cfg.dtype,
        "batch_size": cfg.batch_size,
        "pad_to_multiple_of": cfg.prompt_bucket,
        "sdpa_backend": cfg.decode_sdpa,
        "notes": generation_notes(cfg.to_dict()),
    }
    return json.dumps(data, indent=2) + "\n"


_LOOP = '''
import contextlib

import torch
{sdpa_import}from transformers import DynamicCache, StaticCache

DTYPE = torch.{dtype}
BATCH_SIZE = {batch_size}  # prompts generated together
BUCKET = {bucket}  # prompts left-padded to a multiple of this many tokens
NEW_TOKENS = {new_tokens}  # greedy tokens per prompt, always this many
STATIC_CACHE = {static}
DECODE_COMPILE = {decode_compile}  # torch.compile mode of the decode step (None: eager)
COMPILE_PREFILL = {compile_prefill}
PREFILL_SDPA = {prefill_sdpa}  # the forced attention kernels (None: torch's choice)
DECODE_SDPA = {decode_sdpa}
PAD_ID = 0


def left_pad(prompts):
    """Token-id prompts as one batch, left-padded: (ids, attention mask)."""
    width = -(-max(len(p) for p in prompts) // BUCKET) * BUCKET
    ids = torch.full((len(prompts), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    return ids, mask


def _kernels(backends):
    return sdpa_kernel(backends) if backends else contextlib.nullcontext()


@torch.inference_mode()
def generate(model, prompts):
    """Greedy tokens for each prompt (lists of token ids), in batches of BATCH_SIZE."""
    model = model.to(DTYPE).eval()
    device = next(model.parameters()).device
    forward = model.__call__
    decode = torch.compile(forward, mode=DECODE_COMPILE) if DECODE_COMPILE else forward
    prefill = decode if COMPILE_PREFILL else forward
    out = []
    for start in range(0, len(prompts), BATCH_SIZE):
        rows = [list(p) for p in prompts[start : start + BATCH_SIZE]]
        ids, mask = left_pad(rows + [rows[0]] * (BATCH_SIZE - len(rows)))
        ids, width = ids.to(device), ids.shape[1]
        # The mask of every position the generation reaches: one shape for every decode step.
        mask = torch.cat([mask, torch.ones(len(ids), NEW_TOKENS, dtype=torch.long)], dim=1).to(device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        if STATIC_CACHE:
            cache = StaticCache(config=model.config, max_cache_len=width + NEW_TOKENS)
        else:
            cache = DynamicCache(config=model.config)
        with _kernels(PREFILL_SDPA):
            logits = prefill(
                input_ids=ids,
                attention_mask=mask[:, :width],
                position_ids=positions[:, :width],
                {cache_keyword}=cache,
                cache_position=torch.arange(width, device=device),
                use_cache=True,
            ).logits
        token = logits[:, -1].argmax(-1, keepdim=True)
        tokens = [token]
        for position in range(width, width + NEW_TOKENS - 1):
            if DECODE_COMPILE == "reduce-overhead":
                torch.compiler.cudagraph_mark_step_begin()  # a CUDA graph's outputs live until the next replay
            with _kernels(DECODE_SDPA):
                logits = decode(
                    input_ids=token,
                    attention_mask=mask if STATIC_CACHE else mask[:, : position + 1],
                    position_ids=positions[:, position : position + 1],
                    {cache_keyword}=cache,
                    cache_position=torch.tensor([position], device=device),
                    use_cache=True,
                ).logits
            token = logits[:, -1].argmax(-1, keepdim=True).clone()
            tokens.append(token)
        out += torch.cat(tokens, dim=1)[: len(rows)].tolist()
    return out
'''


def cache_keyword() -> str:
    """How the installed transformers' forward takes the cache: `cache` (5.2x renamed it, and warns
    on the old name), else `past_key_values`."""
    if importlib.util.find_spec("transformers") is None:
        return "cache"
    import inspect

    from transformers import LlamaForCausalLM

    return "cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters else "past_key_values"


def decode_loop(recipe: Recipe) -> str:
    """`decode-loop`: the recipe as a plain PyTorch decode loop over a transformers causal LM."""
    cfg = recipe.config
    lines = _header(recipe, "A plain PyTorch decode loop", "the loop generate runs, with the recipe's settings")
    lines += [
        comment("Use: generate(model, prompts) with a transformers causal LM and token-id prompts (lists of ints):"),
        comment("greedy, NEW_TOKENS each, the same tokens as model.generate with the recipe's GenerationConfig."),
    ]
    text = _LOOP.format(
        cache_keyword=python_name(cache_keyword()),
        sdpa_import="".join(line + "\n" for line in _sdpa_import({cfg.prefill_sdpa, cfg.decode_sdpa})),
        dtype=python_name(cfg.dtype),
        batch_size=python_literal(cfg.batch_size),
        bucket=python_literal(cfg.prompt_bucket),
        new_tokens=python_literal(int(recipe.workload["new_tokens"])),
        static=python_literal(cfg.kv_cache == "static"),
        decode_compile=python_literal(None if cfg.decode_compile == "none" else cfg.decode_compile),
        compile_prefill=python_literal(cfg.compile_prefill),
        prefill_sdpa=None if cfg.prefill_sdpa == "auto" else _kernel(cfg.prefill_sdpa),
        decode_sdpa=None if cfg.decode_sdpa == "auto" else _kernel(cfg.decode_sdpa),
    )
    return "\n".join(lines) + "\n" + text
