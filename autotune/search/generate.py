"""`autotune search --task generate`: the study of a text generation workload, through the
same machinery as training's (`search.run.run_search` runs it): the study and its storage
(`study.lifecycle`), each trial in its own process (`trial.generate`), the typed record
(`study.record`), the leaders measured again (`search.confirm`), the recipe.

What differs is here: the workload (prompt lengths, new tokens), the space and its reference
trials (`search.generation_space`, which says why TPE proposes the trials), and the objective:
output tokens/s at the batch (or, `--objective latency`, the request's tokens/s at batch 1: its
inverse latency), under constraints recorded on every trial with Optuna's `set_constraint`:

    memory               the worst-case peak against the limit less the headroom
    recompiles           compile events while the generations were timed (> 0: infeasible)
    p99_token_latency    (p99 time per output token - bound) / bound, with --max-p99-token-latency
    ttft                 (p99 time to first token - bound) / bound, with --max-ttft

A configuration whose greedy tokens leave the eager float32 reference is `diverged`: pruned,
never the best."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import socket
from dataclasses import dataclass
from typing import Any, Callable

import optuna

from autotune.config import DEFAULT_AGREE_TOKENS, GenerateConfig, GenerateSpec, check_workload_fits
from autotune.device import DeviceInfo, describe, resolve_device
from autotune.device.info import software_versions
from autotune.errors import UsageError
from autotune.knobs.support import DeviceCapabilities
from autotune.measure import outcomes
from autotune.search.generation_space import (
    GenerationSpace,
    generation_space,
    parse_batches,
    parse_fixed,
    reference_config,
)
from autotune.search.objective import Objective
from autotune.search.references import enqueue_references
from autotune.search.run import (
    OpenedStudy,
    SearchResult,
    _trial_timeout,
    check_task_options,
    memory_headroom,
    memory_limit,
    model_slug,
    search_study,
    study_location,
)
from autotune.search.settings import SearchSettings
from autotune.study import record
from autotune.study.lifecycle import fail_orphaned_trials, open_study, worker_seed
from autotune.study.record import BOUND_OPTIONS, P99_TOKEN_LATENCY, TTFT
from autotune.study.references import REFERENCE_ATTR
from autotune.study.storage import heartbeat_grace_s, open_storage
from autotune.trial.generate import model_facts, prompt_lengths_in_child, run_generation_trial
from autotune.trial.runner import TrialResult

log = logging.getLogger(__name__)

GENERATE = "generate"
DEFAULT_PROMPT_LEN = 32
DEFAULT_NEW_TOKENS = 32
LATENCY = "latency"
RECOMPILES = "recompiles"
# TPE's random start: a sixth or so of a CPU space (a few hundred configurations), then its model.
STARTUP_TRIALS = 8


@dataclass(frozen=True)
class GenerateStudyContext:
    """Everything that must stay the same for the trials of a generation study to be comparable."""

    spec: GenerateSpec
    device: DeviceInfo
    space: GenerationSpace
    memory_limit_bytes: int
    trial_timeout_s: float
    memory_headroom: float = outcomes.DEFAULT_MEMORY_HEADROOM
    objective: str = "tokens_per_sec"
    max_p99_token_latency_s: float | None = None
    max_ttft_s: float | None = None

    def __post_init__(self) -> None:
        # The run judges memory itself (outcomes.decide_generated) against the study's limit and headroom.
        spec = dataclasses.replace(
            self.spec, memory_headroom=self.memory_headroom, memory_limit_bytes=self.memory_limit_bytes
        )
        object.__setattr__(self, "spec", spec)

    @property
    def capabilities(self) -> DeviceCapabilities:
        return DeviceCapabilities.detect(self.device.kind, self.device.capability_tuple)

    @property
    def bounds(self) -> dict[str, float | None]:
        return {P99_TOKEN_LATENCY: self.max_p99_token_latency_s, TTFT: self.max_ttft_s}

    def workload(self) -> dict[str, Any]:
        lens = self.spec.prompt_lens
        return {
            "prompts": hashlib.sha256(json.dumps(list(lens)).encode()).hexdigest()[:16],
            "prompt_len_min": min(lens),
            "prompt_len_max": max(lens),
            "prompt_len_mean": sum(lens) / len(lens),
            "new_tokens": self.spec.new_tokens,
            "agree_tokens": self.spec.agree_tokens,
        }

    def identity(self) -> dict[str, Any]:
        return {
            "task": GENERATE,
            "model": self.spec.model,
            "device_name": self.device.name,
            "device_uuid": self.device.uuid,
            "workload": self.workload(),
            "space_hash": self.space.hash,
        }

    def attrs(self) -> dict[str, Any]:
        return {
            "autotune": {"kind": "search", "software": software_versions()},
            "task": GENERATE,
            "hardware": self.device.to_dict(),
            "model": self.spec.model,
            "memory_limit_bytes": self.memory_limit_bytes,
            "memory_headroom": self.memory_headroom,
            "objective": self.objective,
            "space": self.space.to_dict(),
            "space_hash": self.space.hash,
            "identity": self.identity(),
            "workload": {**self.workload(), "prompt_lens": list(self.spec.prompt_lens)},
            "bounds": self.bounds,
            "run": {
                "warmup": self.spec.warmup,
                "steps": self.spec.steps,
                "min_time_s": self.spec.min_time_s,
                "seed": self.spec.seed,
            },
        }


# --- before anything is written ---------------------------------------------------------------------


def workload_lengths(
    prompt_len: int | None, prompts: str | None, vocab_size: int, *, timeout_s: float | None = None
) -> tuple[int, ...]:
    """The prompt lengths: --prompts' (their distribution), else --prompt-len (default 32). With
    `timeout_s` (the tuner, which imports no torch) the file is read in a child process."""
    if prompts and prompt_len is not None:
        raise UsageError("give --prompt-len or --prompts, not both")
    if prompts and timeout_s is not None:
        return prompt_lengths_in_child(prompts, vocab_size=vocab_size, timeout_s=timeout_s)
    if prompts:
        from autotune.data.prompts import prompt_lengths

        return prompt_lengths(prompts, vocab_size=vocab_size)
    return (prompt_len or DEFAULT_PROMPT_LEN,)


@dataclass(frozen=True)
class Workload:
    """A generation workload, checked against its model."""

    lens: tuple[int, ...]  # prompt lengths
    new_tokens: int
    context: int  # the model's
    transformers: bool  # a transformers model (it generates through generate)


def resolve_workload(
    model: str,
    prompt_len: int | None,
    prompts: str | None,
    new_tokens: int | None,
    *,
    timeout_s: float,
    host_limit_bytes: int | None,
    in_child: bool = True,
) -> Workload:
    """The model's facts and the prompt lengths (a prompts file read in a child process unless
    `in_child` is False: bench, which has torch already), refused in one line when they do not fit."""
    vocab, context, transformers = model_facts(model, timeout_s=timeout_s, host_limit_bytes=host_limit_bytes)
    lens = workload_lengths(prompt_len, prompts, vocab, timeout_s=timeout_s if in_child else None)
    new_tokens = new_tokens or DEFAULT_NEW_TOKENS
    check_workload_fits(model, max(lens), new_tokens, context)
    return Workload(lens, new_tokens, context, transformers)


def prepare_generation(settings: SearchSettings) -> tuple[GenerateStudyContext, str, str]:
    """Validate everything before anything is written: (context, study name, storage URL)."""
    check_task_options(settings)
    fixed = parse_fixed(settings.fix)  # before the model is probed (seconds): a bad --fix at once
    device_name = resolve_device(settings.device)
    device = describe(device_name)
    timeout = _trial_timeout(settings, device.kind)
    limit = memory_limit(settings, device)
    workload = resolve_workload(
        settings.model,
        settings.prompt_len,
        settings.prompts,
        settings.new_tokens,
        timeout_s=timeout,
        host_limit_bytes=limit if device.kind == "cpu" else None,
    )
    lens, new_tokens, context, transformers = (
        workload.lens,
        workload.new_tokens,
        workload.context,
        workload.transformers,
    )
    objective = settings.objective or "tokens_per_sec"
    batches = parse_batches(settings.batch, device.kind)
    if objective == LATENCY:
        if settings.batch is not None and batches != (1,):
            raise UsageError("--objective latency is the fastest request at batch 1: leave --batch out")
        batches = (1,)
    caps = DeviceCapabilities.detect(device.kind, device.capability_tuple)
    space = generation_space(
        caps,
        batches=batches,
        longest_prompt=max(lens),
        new_tokens=new_tokens,
        context=context,
        transformers=transformers,
        fixed=fixed,
    )
    spec = GenerateSpec(
        model=settings.model,
        device=device_name,
        prompt_lens=lens,
        new_tokens=new_tokens,
        warmup=settings.warmup,
        steps=settings.steps,
        min_time_s=settings.min_time_s,
        seed=settings.seed,
        agree_tokens=settings.agree_tokens or DEFAULT_AGREE_TOKENS,
    )
    ctx = GenerateStudyContext(
        spec=spec,
        device=device,
        space=space,
        memory_limit_bytes=limit,
        trial_timeout_s=timeout,
        memory_headroom=memory_headroom(settings),
        objective=objective,
        max_p99_token_latency_s=settings.max_p99_token_latency_s,
        max_ttft_s=settings.max_ttft_s,
    )
    name, url = study_location(settings, f"{model_slug(settings.model)}-{GENERATE}-{device.slug}")
    return ctx, name, url


def open_generate_search(settings: SearchSettings) -> OpenedStudy:
    """Check everything, then open or resume the generation study. A refused run created nothing."""
    ctx, name, url = prepare_generation(settings)
    storage = open_storage(url, grace_period_s=heartbeat_grace_s(url))
    optuna.logging.set_verbosity(optuna.logging.ERROR)

    def on_create(study: optuna.Study) -> None:
        if settings.references:
            enqueue_references(study)  # the baseline and the article's cure, first

    study, is_new = open_study(
        name, storage, ctx, sampler=lambda seed: generation_sampler(seed), seed=settings.seed, on_create=on_create
    )
    if not is_new:
        ctx = check_generation_rules(study, ctx, settings)
        study.sampler = generation_sampler(worker_seed(settings.seed, len(study.trials)))
    orphans = fail_orphaned_trials(study)
    if orphans:
        log.warning("failed %d trial(s) left running by a killed tuner: %s", len(orphans), orphans)
    return OpenedStudy(study, is_new, ctx, name, url)


def generation_sampler(seed: int | None) -> optuna.samplers.BaseSampler:
    """TPE over the generation space; it reads every trial's constraints (Optuna 5)."""
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=STARTUP_TRIALS)


def check_generation_rules(
    study: optuna.Study, ctx: GenerateStudyContext, settings: SearchSettings
) -> GenerateStudyContext:
    """The context to resume `study` with: its own limit, headroom, objective and latency bounds
    where the run gives none; UsageError where the run asks for others, or another timed window."""
    attrs = study.user_attrs
    stored = {
        "objective": (attrs.get("objective"), settings.objective is not None, "--objective"),
        "memory_limit_bytes": (attrs.get("memory_limit_bytes"), settings.limit_given, "--memory-limit"),
        "memory_headroom": (attrs.get("memory_headroom"), settings.memory_headroom is not None, "--memory-headroom"),
        "max_p99_token_latency_s": (
            (attrs.get("bounds") or {}).get(P99_TOKEN_LATENCY),
            settings.max_p99_token_latency_s is not None,
            BOUND_OPTIONS[P99_TOKEN_LATENCY],
        ),
        "max_ttft_s": ((attrs.get("bounds") or {}).get(TTFT), settings.max_ttft_s is not None, BOUND_OPTIONS[TTFT]),
    }
    run = attrs.get("run") or {}
    differences = [
        f"--{key.replace('_s', '').replace('_', '-')} {run[key]:g}, this run {getattr(ctx.spec, key):g}"
        for key in ("steps", "min_time_s")
        if run.get(key) is not None and run[key] != getattr(ctx.spec, key)
    ]
    changes = {}
    for key, (value, given, option) in stored.items():
        if value == getattr(ctx, key):
            continue
        if given:
            differences.append(f"{option} {value}, this run {getattr(ctx, key)}")
        else:
            changes[key] = value
    if differences:
        raise UsageError(
            f"study {study.study_name!r} was measured with {'; '.join(differences)}: trials measured under other "
            "rules cannot be compared. Resume it with its settings, or start a new study (--new-study, or --study NAME)"
        )
    return dataclasses.replace(ctx, **changes)


def run_generate_search(settings: SearchSettings, reporter: Any = None) -> SearchResult:
    """`search --task generate` as a library call: settings in, a study and the best recipe out."""
    opened = open_generate_search(settings)
    objective = GenerationObjective(opened.ctx, on_running=reporter.trial_started if reporter else None)
    return search_study(opened, objective, settings, reporter)


# --- the trials ---------------------------------------------------------------------------------


def _proposer(trial: optuna.Trial) -> str:
    """What proposed a sampled trial: TPE's random start (its first trials), then TPE's model."""
    sampled = [t for t in trial.study.get_trials(deepcopy=False) if REFERENCE_ATTR not in t.user_attrs]
    return "random_start" if len(sampled) <= STARTUP_TRIALS else "tpe"


class GenerationObjective(Objective):
    """A generation trial: its configuration (a reference's, or TPE's), refused at no cost when it
    cannot run here, else run in its own process and recorded with its constraints."""

    ctx: GenerateStudyContext

    def __init__(self, ctx: GenerateStudyContext, on_running: Callable[[int, Any], None] | None = None) -> None:
        super().__init__(ctx, on_running, memory_model=False)  # type: ignore[arg-type]

    def _trial(self, trial: optuna.Trial) -> float:
        reference = trial.user_attrs.get(REFERENCE_ATTR)
        caps = self.ctx.capabilities
        if reference:
            cfg, notes = reference_config(reference, caps, transformers=self.ctx.space.transformers)
            if notes:
                trial.set_user_attr("reference_notes", notes)
        else:
            cfg = self.ctx.space.suggest(trial)
            trial.set_user_attr(record.PROPOSED_BY, _proposer(trial))
        trial.set_user_attr(record.CONFIG, cfg.to_dict())
        trial.set_user_attr(record.HOST, socket.gethostname())
        trial.set_user_attr(record.TUNER_PID, os.getpid())
        if self.ctx.device.uuid:
            trial.set_user_attr(record.DEVICE_UUID, self.ctx.device.uuid)
        why = self.ctx.space.violation(cfg, caps)
        if why is not None:  # pruned at no cost: no process starts
            return self._record(trial, TrialResult(outcomes.UNSUPPORTED, why))
        result = self._reuse(trial, cfg) or self._run(trial, cfg)
        return self._record(trial, result)

    def _measure(self, cfg: GenerateConfig, *, on_start: Callable[[int], None]) -> TrialResult:  # type: ignore[override]
        return run_generation_trial(
            self.ctx.spec, cfg, timeout_s=self.ctx.trial_timeout_s, device=self.ctx.device, on_start=on_start
        )

    def _constraints(self, how: outcomes.Recording, result: TrialResult) -> dict[str, float]:
        constraints = super()._constraints(how, result)
        m = result.measurement
        if how is not outcomes.Recording.MEASURED or m is None:
            return constraints
        constraints[RECOMPILES] = float(m.recompiles_during_timing)
        figures = m.generation or {}
        measured = {P99_TOKEN_LATENCY: figures.get("token_latency_p99_s"), TTFT: figures.get("ttft_p99_s")}
        for name, bound in self.ctx.bounds.items():
            if bound is not None and measured[name] is not None:
                constraints[name] = (measured[name] - bound) / bound
        return constraints
