"""The training task: a study of training steps, measured in effective tokens/s.

Its space is a file (`search_spaces/`, `space.file`); its model a name of ours, a Hugging Face
config or a user's factory (built in a trial process by `trial.probe`, under the trial timeout);
its data synthetic or a file; its trials proposed by the planner (`search.planner`), each run by
`trial.runner` on one rank or several (`--nproc-per-node`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import optuna

from autotune import registry
from autotune.config import RunSpec, TrainConfig, check_int, parse_fixed
from autotune.device import DeviceInfo, visible_gpu_count
from autotune.errors import UnsupportedConfig, UsageError
from autotune.knobs.support import check_supported
from autotune.model.sizes import ModelDims
from autotune.search.references import reference_config
from autotune.search.sampler import study_sampler
from autotune.search.task import Basics, Rule, Task, model_slug
from autotune.space.definition import SearchSpace
from autotune.space.file import default_space_path, load_space, with_fixed
from autotune.space.sampling import suggest
from autotune.study.study_record import StudyRecord
from autotune.trial.runner import TrialResult, run_trial

if TYPE_CHECKING:
    from autotune.search.settings import SearchSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class TrainTask(Task):
    """Everything that must stay the same for the trials of a training study to be comparable."""

    name: ClassVar[str] = registry.TRAIN
    objectives: ClassVar[tuple[str, ...]] = ("tokens_per_sec", "tokens_per_joule")
    # The options only this task takes (SearchSettings' fields): another task refuses them.
    options: ClassVar[tuple[str, ...]] = (
        "data",
        "seq_len",
        "global_batch_tokens",
        "space",
        "warm_start_from",
        "nproc_per_node",
    )
    config_type: ClassVar[type] = TrainConfig
    predicts_memory: ClassVar[bool] = True
    spec: RunSpec
    space: SearchSpace
    model_dims: ModelDims | None = None  # for the expert start's budget estimate; None when unknown

    @property
    def ranks(self) -> int:
        return self.spec.nproc_per_node

    @classmethod
    def check_options(cls, settings: "SearchSettings") -> None:
        parse_fixed(settings.fix)  # a bad --fix at once, before the model or the device is looked at

    @classmethod
    def resolve(cls, settings: "SearchSettings", basics: "Basics") -> "TrainTask":
        """The training study's context, every part of it checked: the model (a factory or a data
        file read in a trial process, under the trial timeout), the space, the ranks, the batch."""
        from autotune.model.sizes import MODEL_SIZES  # without torch

        device = basics.device
        if settings.seq_len is not None:
            check_int("--seq-len", settings.seq_len, minimum=2)
        if settings.model in MODEL_SIZES:
            cfg = MODEL_SIZES[settings.model]
            if settings.seq_len and settings.seq_len > cfg.block_size:
                raise UsageError(
                    f"--seq-len {settings.seq_len} is longer than {settings.model}'s context {cfg.block_size}"
                )
            seq_len, n_layer = settings.seq_len or cfg.block_size, cfg.n_layer
            dims: ModelDims | None = ModelDims(cfg.n_layer, cfg.n_embd, cfg.vocab_size)
        if settings.data != "synthetic":
            from autotune.data.datasets import check_data_spec

            check_data_spec(settings.data)  # at once; its content is read by the probe below
        if settings.model not in MODEL_SIZES or settings.data != "synthetic":
            # A user's factory, or a data file: built and read in a trial process, under the
            # trial timeout, so its failures are one line here and never a study locked to them.
            from autotune.trial.probe import probe

            probed = probe(
                settings.model,
                data=settings.data,
                seq_len=settings.seq_len,
                timeout_s=basics.trial_timeout_s,
                host_limit_bytes=basics.memory_limit_bytes if device.kind == "cpu" else None,
            )
            seq_len, n_layer = probed.context_length, probed.n_layer
            dims = ModelDims(probed.n_layer, probed.d_model, probed.vocab_size) if probed.d_model else None
        space = load_space(
            settings.space or default_space_path(device.kind, settings.nproc_per_node), n_layer=n_layer, seq_len=seq_len
        )
        space = with_fixed(space, parse_fixed(settings.fix))
        _check_ranks(settings, space, basics.device_name)
        spec = RunSpec(
            model=settings.model,
            device=basics.device_name,
            data=settings.data,
            seq_len=settings.seq_len,
            warmup=settings.warmup,
            steps=settings.steps,
            min_time_s=_min_time(settings.min_time_s, basics.objective, basics.device),
            seed=settings.seed,
            memory_limit_bytes=basics.memory_limit_bytes,
            global_batch_tokens=settings.global_batch_tokens,
            nproc_per_node=settings.nproc_per_node,
        )
        _check_global_batch(space, spec.global_batch_tokens, spec.nproc_per_node)
        return cls(spec=spec, space=space, model_dims=dims, **basics.fields())

    def default_study_name(self, model: str) -> str:
        return default_study_name(model, self.device.slug, self.ranks)

    # --- the study ----------------------------------------------------------------------------

    def identity(self) -> dict[str, Any]:
        return {
            "model": self.spec.model,
            "data": self.spec.data,
            "seq_len": self.space.seq_len,
            "device_name": self.device.name,
            "device_uuid": self.device.uuid,
            "space_hash": self.space.hash,
        }

    def record(self) -> StudyRecord:
        return self._record(
            self.space,
            global_batch_tokens=self.spec.global_batch_tokens,
            data=self.spec.data,
            seq_len=self.space.seq_len,
            n_layer=self.space.n_layer,
            space_source=self.space.source,
        )

    def sampler(self, seed: int | None) -> optuna.samplers.BaseSampler:
        return study_sampler(self, seed)

    # --- a trial ------------------------------------------------------------------------------

    def configure(self, trial: optuna.Trial, reference: str | None) -> TrainConfig:
        if reference:
            cfg, notes = reference_config(reference, self.space.seq_len, self.capabilities, self.ranks)
            if notes:
                trial.set_user_attr("reference_notes", notes)
            return cfg
        return suggest(self.space, trial)

    def refusal(self, cfg: TrainConfig) -> str | None:
        reason = self.space.violation(cfg)
        if reason is None:
            try:
                check_supported(cfg, self.capabilities)
                self.spec.accumulation_steps(cfg)  # a budget that does not divide the global batch
            except UnsupportedConfig as exc:
                reason = str(exc)
        return reason

    def measure(
        self,
        cfg: TrainConfig,
        *,
        on_start: Callable[[int], None] | None = None,
        prune_below: float | None = None,
        env: dict[str, str] | None = None,
    ) -> TrialResult:
        spec = self.spec
        # A short first window is judged on tokens/s, and is too short for an energy figure:
        # under tokens_per_joule every trial is timed in full.
        if prune_below is not None and self.objective != "tokens_per_joule":
            spec = replace(spec, prune_below_tokens_per_sec=prune_below)
        return run_trial(spec, cfg, timeout_s=self.trial_timeout_s, device=self.device, env=env, on_start=on_start)

    # --- resuming -----------------------------------------------------------------------------

    def rules(self, attrs: dict[str, Any], settings: "SearchSettings") -> list[Rule]:
        run = StudyRecord.read(attrs).run
        asked = self.spec.global_batch_tokens
        return [
            *super().rules(attrs, settings),
            # A study made before global batches existed has no key: it measured without accumulation.
            Rule(
                "--global-batch-tokens",
                run.global_batch_tokens,
                asked,
                asked is not None,
                lambda v: {"spec": replace(self.spec, global_batch_tokens=v)},
                lambda v: "unset" if v is None else str(v),
            ),
            # Tokens/s of N ranks is another figure than one rank's: a study has one world size.
            Rule("--nproc-per-node", run.nproc_per_node, self.ranks, True),
        ]


def default_study_name(model: str, device_slug: str, ranks: int = 1) -> str:
    """`gpt2-tiny-cpu`; `gpt2-tiny-cpu-2ranks` for a search of 2 ranks a trial, whose tokens/s is
    another figure than one rank's (a study of one rank keeps the name it always had)."""
    name = f"{model_slug(model)}-{device_slug}"
    return f"{name}-{ranks}ranks" if ranks > 1 else name


def _min_time(min_time_s: float, objective: str, device: DeviceInfo) -> float:
    """The timed window's least seconds: under tokens_per_joule, at least what the energy
    counter resolves (5 s for NVML's; a shorter window has no energy figure)."""
    if objective != "tokens_per_joule":
        return min_time_s
    from autotune.measure.energy import energy_meter

    needed = energy_meter(device.kind, device.uuid).min_window_s
    if min_time_s < needed:
        log.info("--min-time %g s raised to %g s: the energy counter resolves no shorter window", min_time_s, needed)
    return max(min_time_s, needed)


def _check_global_batch(space: SearchSpace, global_batch_tokens: int | None, ranks: int = 1) -> None:
    """Refuse a global batch that no token budget of the space (times the ranks: the global
    batch is across them) divides: every trial would be pruned. Budgets that do not divide it
    are pruned one by one (`RunSpec.accumulation_steps`)."""
    if global_batch_tokens is None:
        return
    budgets = _token_budgets(space)
    if budgets and not any(
        global_batch_tokens % (b * ranks) == 0 and b * ranks <= global_batch_tokens for b in budgets
    ):
        listed = ", ".join(map(str, budgets))
        ranks_said = f" times the {ranks} ranks" if ranks > 1 else ""
        raise UsageError(
            f"--global-batch-tokens {global_batch_tokens}: no token_budget of the space ({listed}){ranks_said} "
            "divides it; choose a multiple of one of them"
        )


def _token_budgets(space: SearchSpace) -> list[int]:
    """The token budgets a space can give a trial, where it lists them (fixed, or choices); an
    integer range is left to the trials."""
    if "token_budget" in space.fixed:
        return [space.fixed["token_budget"]]
    dimension = space.dimensions.get("token_budget")
    if dimension is not None and dimension.choices:
        return list(dimension.choices)
    if dimension is None:
        return [TrainConfig().token_budget]
    return []


def _check_ranks(settings: "SearchSettings", space: SearchSpace, device: str) -> None:
    """Several ranks: on CUDA they are cuda:0 ... cuda:N-1 (one device named is refused), and the
    space must say how they share the model (a trial of parallelism=none is refused by its rule)."""
    ranks = settings.nproc_per_node
    if ranks == 1:
        return
    if ":" in settings.device.strip():  # the user's; `device` is resolved, always with its index
        raise UsageError(
            f"--nproc-per-node {ranks} runs ranks on cuda:0 ... cuda:{ranks - 1}: give --device cuda, and choose the "
            "GPUs with CUDA_VISIBLE_DEVICES"
        )
    if device.startswith("cuda") and ranks > (visible := visible_gpu_count()):
        # Each rank takes a GPU of its own: every trial would crash at its first rank past the last.
        raise UsageError(
            f"--nproc-per-node {ranks} runs a rank per GPU, and this process sees {visible}: give at most "
            f"--nproc-per-node {visible}, or make more GPUs visible (CUDA_VISIBLE_DEVICES)"
        )
    fixed = space.fixed.get("parallelism")
    searched = space.dimensions.get("parallelism")
    if (fixed in (None, "none")) and (searched is None or not set(searched.choices or ()) - {"none"}):
        raise UsageError(
            f"--nproc-per-node {ranks}: the space {space.source} neither searches nor fixes parallelism (ddp, fsdp2), "
            "so every trial would be refused; use search_spaces/gpt2_ddp.yaml (cpu_ddp.yaml on CPU) or add it"
        )
