"""The generation task (`autotune search --task generate`): a study of a text generation
workload, run by the one search path (`search.run`) as training's is; each trial in its own
process (`trial.generate`).

What differs from training is here: the workload (prompt lengths, new tokens), the space and its reference
trials (`search.generation_space`), the planner that proposes the trials and says when to stop
(`search.generation_planner`), and the objective:
output tokens/s at the batch (or, `--objective latency`, the request's tokens/s at batch 1: its
inverse latency), under constraints recorded on every trial with Optuna's `set_constraint`:

    memory               the worst-case peak against the limit less the headroom
    recompiles           compile events while the generations were timed (> 0: infeasible)
    p99_token_latency    (p99 time per output token - bound) / bound, with --max-p99-token-latency
    ttft                 (p99 time to first token - bound) / bound, with --max-ttft

A configuration whose greedy tokens leave the eager float32 reference is `diverged`: pruned,
never the best."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import optuna

from autotune.config import DEFAULT_AGREE_TOKENS, GenerateConfig, GenerateSpec, check_workload_fits, parse_fixed
from autotune.errors import UsageError
from autotune.knobs.support import DeviceCapabilities
from autotune.registry import GENERATE
from autotune.search.generation_space import (
    GenerationSpace,
    generation_space,
    parse_batches,
    reference_config,
)
from autotune.search.task import Basics, Rule, Task, model_slug
from autotune.study.record import BOUND_OPTIONS, P99_TOKEN_LATENCY, TTFT
from autotune.study.study_record import StudyRecord
from autotune.trial.generate import model_facts, prompt_lengths_in_child, run_generation_trial
from autotune.trial.runner import TrialResult

if TYPE_CHECKING:
    from autotune.search.settings import SearchSettings

log = logging.getLogger(__name__)

DEFAULT_PROMPT_LEN = 32
DEFAULT_NEW_TOKENS = 32
LATENCY = "latency"
RECOMPILES = "recompiles"


@dataclass(frozen=True, kw_only=True)
class GenerateTask(Task):
    """Everything that must stay the same for the trials of a generation study to be comparable."""

    name: ClassVar[str] = GENERATE
    objectives: ClassVar[tuple[str, ...]] = ("tokens_per_sec", LATENCY)
    # The options only this task takes (SearchSettings' fields): another task refuses them.
    options: ClassVar[tuple[str, ...]] = (
        "prompt_len",
        "prompts",
        "new_tokens",
        "batch",
        "max_p99_token_latency_s",
        "max_ttft_s",
        "agree_tokens",
    )
    config_type: ClassVar[type] = GenerateConfig
    spec: GenerateSpec
    space: GenerationSpace
    max_p99_token_latency_s: float | None = None
    max_ttft_s: float | None = None

    @property
    def bounds(self) -> dict[str, float | None]:
        return {P99_TOKEN_LATENCY: self.max_p99_token_latency_s, TTFT: self.max_ttft_s}

    @classmethod
    def check_options(cls, settings: "SearchSettings") -> None:
        parse_fixed(settings.fix, task=GENERATE)  # before the model is probed (seconds): a bad --fix at once

    @classmethod
    def resolve(cls, settings: "SearchSettings", basics: "Basics") -> "GenerateTask":
        """The generation study's context: the model's facts and the workload (read in a child
        process), the batches, the space this device can run."""
        device = basics.device
        workload = resolve_workload(
            settings.model,
            settings.prompt_len,
            settings.prompts,
            settings.new_tokens,
            timeout_s=basics.trial_timeout_s,
            host_limit_bytes=basics.memory_limit_bytes if device.kind == "cpu" else None,
        )
        batches = parse_batches(settings.batch, device.kind)
        if basics.objective == LATENCY:
            if settings.batch is not None and batches != (1,):
                raise UsageError("--objective latency is the fastest request at batch 1: leave --batch out")
            batches = (1,)
        space = generation_space(
            DeviceCapabilities.detect(device.kind, device.capability_tuple),
            batches=batches,
            longest_prompt=max(workload.lens),
            new_tokens=workload.new_tokens,
            context=workload.context,
            transformers=workload.transformers,
            fixed=parse_fixed(settings.fix, task=GENERATE),
        )
        spec = GenerateSpec(
            model=settings.model,
            device=basics.device_name,
            prompt_lens=workload.lens,
            new_tokens=workload.new_tokens,
            warmup=settings.warmup,
            steps=settings.steps,
            min_time_s=settings.min_time_s,
            seed=settings.seed,
            agree_tokens=settings.agree_tokens or DEFAULT_AGREE_TOKENS,
        )
        return cls(
            spec=spec,
            space=space,
            max_p99_token_latency_s=settings.max_p99_token_latency_s,
            max_ttft_s=settings.max_ttft_s,
            **basics.fields(),
        )

    def default_study_name(self, model: str) -> str:
        return f"{model_slug(model)}-{GENERATE}-{self.device.slug}"

    # --- the study ----------------------------------------------------------------------------

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

    def record(self) -> StudyRecord:
        workload = {**self.workload(), "prompt_lens": list(self.spec.prompt_lens)}
        return self._record(self.space, workload=workload, bounds=self.bounds)

    def sampler(self, seed: int | None) -> optuna.samplers.BaseSampler:
        """The generation planner's proposals and stop rule (`search.generation_planner`), built when first asked."""
        from autotune.measure import outcomes
        from autotune.search.generation_planner import GenerationPlanner
        from autotune.search.sampler import PlannerSampler

        limit = outcomes.feasible_peak_bytes(self.memory_limit_bytes, self.memory_headroom)

        def planner() -> GenerationPlanner:
            return GenerationPlanner(
                self.space, self.capabilities, feasible_limit=limit, bounds=self.bounds, seed=seed or 0
            )

        return PlannerSampler(planner, seed=seed)

    # --- a trial ------------------------------------------------------------------------------

    def configure(self, trial: optuna.Trial, reference: str | None) -> GenerateConfig:
        if reference:
            cfg, notes = reference_config(reference, self.capabilities, transformers=self.space.transformers)
            if notes:
                trial.set_user_attr("reference_notes", notes)
            return cfg
        return self.space.suggest(trial)

    def refusal(self, cfg: GenerateConfig) -> str | None:
        return self.space.violation(cfg, self.capabilities)

    def measure(
        self,
        cfg: GenerateConfig,
        *,
        on_start: Callable[[int], None] | None = None,
        prune_below: float | None = None,
        env: dict[str, str] | None = None,
    ) -> TrialResult:
        return run_generation_trial(
            self.spec, cfg, timeout_s=self.trial_timeout_s, device=self.device, on_start=on_start
        )

    def constraints(self, result: TrialResult) -> dict[str, float]:
        """Compile events while the generations were timed (> 0: infeasible), and each latency
        bound's (measured - bound) / bound."""
        m = result.measurement
        assert m is not None
        constraints = {RECOMPILES: float(m.recompiles_during_timing)}
        figures = m.generation or {}
        measured = {P99_TOKEN_LATENCY: figures.get("token_latency_p99_s"), TTFT: figures.get("ttft_p99_s")}
        for name, bound in self.bounds.items():
            if bound is not None and measured[name] is not None:
                constraints[name] = (measured[name] - bound) / bound
        return constraints

    # --- resuming -----------------------------------------------------------------------------

    def rules(self, attrs: dict[str, Any], settings: "SearchSettings") -> list[Rule]:
        bounds = StudyRecord.read(attrs).bounds or {}
        given = {P99_TOKEN_LATENCY: settings.max_p99_token_latency_s, TTFT: settings.max_ttft_s}
        fields = {P99_TOKEN_LATENCY: "max_p99_token_latency_s", TTFT: "max_ttft_s"}
        return [
            *super().rules(attrs, settings),
            *(
                Rule(
                    BOUND_OPTIONS[name],
                    bounds.get(name),
                    self.bounds[name],
                    given[name] is not None,
                    lambda v, field=fields[name]: {field: v},
                )
                for name in (P99_TOKEN_LATENCY, TTFT)
            ),
        ]


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


# --- the trials ---------------------------------------------------------------------------------
