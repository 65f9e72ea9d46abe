"""A generation trial in its own process (`python -m autotune.trial --generate ...`), run and
reaped as every trial is (`trial.runner.run_child`: its own session, the timeout, the CPU memory
watchdog, everything it started killed at its end); and what the tuner needs of a model before
any generation trial (`model_facts`: a config directory is read in a probe process)."""

from __future__ import annotations

from autotune.config import GenerateConfig, GenerateSpec
from autotune.device import DeviceInfo
from autotune.errors import UsageError
from autotune.trial.runner import TrialResult, run_child, trial_result


def run_generation_trial(
    spec: GenerateSpec,
    cfg: GenerateConfig,
    *,
    timeout_s: float,
    device: DeviceInfo | None = None,
    on_start=None,
) -> TrialResult:
    """Measure `cfg` on `spec`'s workload in a child process. Never raises for what the trial
    does; a stop signal kills the child's processes and propagates (as `run_trial`)."""
    request = {"spec": spec.to_dict(), "config": cfg.to_dict(), "device": device.to_dict() if device else None}
    limit = spec.memory_limit_bytes if spec.device_kind == "cpu" else None
    child = run_child(["--generate"], request, timeout_s=timeout_s, on_start=on_start, rss_limit=limit)
    return trial_result(child)


def model_facts(model: str, *, timeout_s: float, host_limit_bytes: int | None) -> tuple[int, int, bool]:
    """(vocabulary, context, a transformers model?) of a model generation can measure, without
    torch for autotune's names; UsageError for a user's factory."""
    from autotune.model.hf import HF_MODELS, is_builtin_hf_name, is_hf_name
    from autotune.model.load import check_model_name, is_factory_name
    from autotune.model.sizes import MODEL_SIZES

    if is_factory_name(model):
        raise UsageError(
            f"model {model!r}: generation is measured on autotune's GPT (gpt2, ..., gpt2-tiny) and Hugging Face "
            "models (hf:NAME, hf:PATH), which have a cached decode path; a factory's model has none that autotune knows"
        )
    check_model_name(model)
    if model in MODEL_SIZES:
        return MODEL_SIZES[model].vocab_size, MODEL_SIZES[model].block_size, False
    if is_builtin_hf_name(model):
        kind, kwargs = HF_MODELS[model[len("hf:") :]]
        context = kwargs.get("n_positions", kwargs.get("max_position_embeddings", 1024))
        return kwargs.get("vocab_size", 50257), context, True
    from autotune.trial.probe import probe  # hf:PATH: its config is read in a trial process

    probed = probe(model, timeout_s=timeout_s, host_limit_bytes=host_limit_bytes)
    return probed.vocab_size, probed.context_length, is_hf_name(model)


def prompt_lengths_in_child(path: str, *, vocab_size: int, timeout_s: float) -> tuple[int, ...]:
    """A prompts file's token lengths (`data.prompts`), read in a child process: the tokenizers'
    package imports torch, which the tuner does not. UsageError (one line) for a bad file."""
    request = {"path": str(path), "vocab_size": vocab_size}
    child = run_child(["--prompts"], request, timeout_s=timeout_s)
    payload = child.payload or {}
    if "lengths" in payload:
        return tuple(payload["lengths"])
    raise UsageError(
        payload.get("error") or f"--prompts {path}: reading it failed ({child.stderr_tail.strip()[-200:]})"
    )
