"""The search: an Optuna study over a space, one isolated trial per configuration.

The objective maximizes effective tokens/s. Memory is a constraint (`trial.set_constraint`,
feasible when <= 0: (peak - limit) / limit), so TPE learns where the feasible region is and
an infeasible trial can never be the best. How a trial is recorded, by outcome:

    ok, over_memory_limit   COMPLETE, value = tokens/s, constraint from the measured peak
    oom                     COMPLETE, value = 0, constraint 1 (infeasible)
                            (so is over_memory_limit stopped early by the CPU RSS watchdog)
    unsupported             PRUNED before any process starts (or after the run said so)
    timeout, crashed        FAIL, with the reason
    interrupted             FAIL (Ctrl-C), with the reason

Every trial carries readable user attrs: outcome, reason, config, tokens_per_sec,
peak_memory_bytes and the whole measurement, so optuna-dashboard shows them as they are.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune import outcomes
from autotune.config import RunSpec, TrainConfig
from autotune.device import DeviceInfo
from autotune.errors import UsageError
from autotune.knobs import DeviceCapabilities, check_supported
from autotune.errors import UnsupportedConfig
from autotune.runner import TrialResult, process_alive, run_trial
from autotune.space import SearchSpace
from autotune.storage import RetryStaleTrial

log = logging.getLogger(__name__)

BASELINE, CHECKLIST = "baseline", "checklist"
REASON_LIMIT = 4000  # characters of a reason kept in storage


class TrialFailed(Exception):
    """Raised from the objective for timeout/crashed/interrupted: Optuna records FAIL."""


@dataclass(frozen=True)
class StudyContext:
    """Everything that must stay the same for the trials of one study to be comparable."""

    spec: RunSpec
    device: DeviceInfo
    space: SearchSpace
    memory_limit_bytes: int
    trial_timeout_s: float

    def identity(self) -> dict[str, Any]:
        return {
            "model": self.spec.model,
            "data": self.spec.data,
            "seq_len": self.space.seq_len,
            "device_name": self.device.name,
            "device_uuid": self.device.uuid,
            "space_hash": self.space.hash,
        }


def study_attrs(ctx: StudyContext) -> dict[str, Any]:
    from autotune.recipe import software_versions

    return {
        "autotune": {"kind": "search", "software": software_versions()},
        "hardware": ctx.device.to_dict(),
        "model": ctx.spec.model,
        "data": ctx.spec.data,
        "seq_len": ctx.space.seq_len,
        "n_layer": ctx.space.n_layer,
        "memory_limit_bytes": ctx.memory_limit_bytes,
        "space": ctx.space.to_dict(),
        "space_source": ctx.space.source,
        "space_hash": ctx.space.hash,
        "identity": ctx.identity(),
        "run": {"warmup": ctx.spec.warmup, "steps": ctx.spec.steps, "min_time_s": ctx.spec.min_time_s,
                "seed": ctx.spec.seed},
    }


def make_sampler(seed: int | None) -> optuna.samplers.BaseSampler:
    """The tuner's sampler, in one place: benchmarks/sample_efficiency.py replays this exact one.
    TPE (multivariate by default in Optuna 5) reads the memory constraint that the objective
    records with `trial.set_constraint`; 5 random start-up trials before it models the space."""
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=5)


# A study is ready once its identity attr is written. Its creator writes every other attr and
# enqueues the reference trials first, so a worker that sees the identity also sees them.
READY_ATTR = "identity"
JOIN_WAIT_S = 30.0  # how long a joining worker waits for the creator to finish setting up


def open_study(name: str, storage, ctx: StudyContext, *, seed: int | None = None) -> tuple[optuna.Study, bool]:
    """Create the study, or resume it when it was made for the same hardware, model, data
    and space. Returns (study, is_new).

    Race-free with many workers: only the one whose `create_study` succeeds sets the study
    up and enqueues the reference trials; the others get DuplicatedStudyError, load it and
    wait until it is ready. (load_if_exists would let two new workers both see an empty
    study and both enqueue the references.)"""
    sampler = make_sampler(seed)
    try:
        study = optuna.create_study(study_name=name, storage=storage, direction="maximize", sampler=sampler)
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler)
    else:
        _set_up(study, ctx)
        return study, True
    existing = _wait_until_ready(study)
    if existing is None:
        if study.trials:
            raise UsageError(f"study {name!r} exists but was not made by `autotune search` (it has no identity): "
                             f"choose another name with --study")
        # Created, then its creator stopped before setting it up: finish the job.
        log.warning("study %r was created but never set up (its creator stopped early): setting it up now", name)
        _set_up(study, ctx)
        return study, True
    if seed is not None:
        study.sampler = make_sampler(worker_seed(seed, len(study.trials)))
    mismatch = _identity_mismatch(existing, ctx.identity())
    if mismatch:
        raise UsageError(f"study {name!r} was made for {mismatch[0]}, this run is {mismatch[1]}: "
                         f"resume it with the same settings, or choose a new name with --study")
    return study, False


def worker_seed(seed: int, n_trials: int, pid: int | None = None) -> int:
    """The sampler seed of a worker joining or resuming a study. Salted with the number of
    trials (a resumed study must not replay the first run's random draws) and the process id
    (workers starting together on one study must not propose the same configurations in
    lockstep)."""
    return (seed * 1_000_003 + n_trials * 7_919 + (os.getpid() if pid is None else pid)) % 2**32


def _set_up(study: optuna.Study, ctx: StudyContext) -> None:
    attrs = study_attrs(ctx)
    identity = attrs.pop(READY_ATTR)
    for key, value in attrs.items():
        study.set_user_attr(key, value)
    enqueue_references(study, ctx)
    study.set_user_attr(READY_ATTR, identity)  # last: the study is ready


def _wait_until_ready(study: optuna.Study) -> dict[str, Any] | None:
    deadline = time.monotonic() + JOIN_WAIT_S
    while True:
        identity = study.user_attrs.get(READY_ATTR)
        if identity is not None or time.monotonic() > deadline:
            return identity
        time.sleep(0.2)


def _identity_mismatch(stored: dict[str, Any], current: dict[str, Any]) -> tuple[str, str] | None:
    # Not the device UUID: workers on several GPUs of one model (--devices, a fleet of hosts)
    # feed one study. The device name (model) must match; which unit it is need not.
    labels = {"model": "model", "data": "data", "seq_len": "context length", "device_name": "device",
              "space_hash": "search space (hash)"}
    for key, label in labels.items():
        if stored.get(key) != current.get(key):
            return f"{label} {stored.get(key)}", f"{label} {current.get(key)}"
    return None


# --- reference trials ------------------------------------------------------------------------


def baseline_config(seq_len: int) -> TrainConfig:
    """The seed's step 1: fp32 eager, math attention, no workers, no pinning, a fixed batch
    of 8 sequences each padded to the full context."""
    return TrainConfig(num_workers=0, pin_memory=False, token_budget=8 * seq_len, batching="fixed",
                       amp_dtype="float32", compile_mode="none", sdpa_backend="math", checkpoint_layers=())


def checklist_config(seq_len: int, caps: DeviceCapabilities) -> tuple[TrainConfig, list[str]]:
    """The seed's "everything on": bf16 (fp16 where bf16 cannot run), compile, flash, pinned
    memory, 4 workers, token-budget batching, no checkpointing. A knob the device cannot run
    goes back to its default; the returned notes say which."""
    cfg = TrainConfig(num_workers=4, pin_memory=True, token_budget=8 * seq_len, batching="padded",
                      amp_dtype="bfloat16", compile_mode="default", sdpa_backend="flash", checkpoint_layers=())
    notes: list[str] = []
    default = TrainConfig()
    for _ in range(len(cfg.to_dict())):
        try:
            check_supported(cfg, caps)
            break
        except UnsupportedConfig as exc:
            if exc.knob == "amp_dtype" and cfg.amp_dtype == "bfloat16":
                cfg = cfg.replace(amp_dtype="float16")
            else:
                cfg = cfg.replace(**{exc.knob: getattr(default, exc.knob)})
            notes.append(f"{exc.knob} changed ({exc.reason})")
    return cfg, notes


def enqueue_references(study: optuna.Study, ctx: StudyContext) -> None:
    for name in (BASELINE, CHECKLIST):
        study.enqueue_trial({}, user_attrs={"reference": name}, skip_if_exists=False)


def reference_config(name: str, ctx: StudyContext) -> tuple[TrainConfig, list[str]]:
    seq_len = ctx.space.seq_len
    if name == BASELINE:
        return baseline_config(seq_len), []
    return checklist_config(seq_len, _caps(ctx.device))


def _caps(device: DeviceInfo) -> DeviceCapabilities:
    return DeviceCapabilities.detect(device.kind, device.capability_tuple)


# --- the objective ---------------------------------------------------------------------------


def config_key(cfg: TrainConfig) -> str:
    return json.dumps(cfg.to_dict(), sort_keys=True)


class Objective:
    """Turns a trial into a configuration, runs it isolated, and records its outcome."""

    def __init__(self, ctx: StudyContext, on_running: Callable[[int, TrainConfig], None] | None = None,
                 trial_env: dict[str, str] | None = None) -> None:
        self.ctx = ctx
        self.on_running = on_running
        self.trial_env = trial_env

    def __call__(self, trial: optuna.Trial) -> float:
        reference = trial.user_attrs.get("reference")
        if reference:
            cfg, notes = reference_config(reference, self.ctx)
            if notes:
                trial.set_user_attr("reference_notes", notes)
        else:
            cfg = self.ctx.space.suggest(trial)
        trial.set_user_attr("config", cfg.to_dict())
        trial.set_user_attr("host", socket.gethostname())
        trial.set_user_attr("tuner_pid", os.getpid())
        if self.ctx.device.uuid:  # which GPU of a multi-GPU or multi-host study ran it
            trial.set_user_attr("device_uuid", self.ctx.device.uuid)
        self._reject_if_impossible(trial, cfg)
        result = self._reuse(trial, cfg) or self._run(trial, cfg)
        return self._record(trial, result)

    def _reject_if_impossible(self, trial: optuna.Trial, cfg: TrainConfig) -> None:
        """Known-impossible combinations never start a process: recorded and pruned at no cost."""
        reason = self.ctx.space.violation(cfg)
        if reason is None:
            try:
                check_supported(cfg, _caps(self.ctx.device))
            except UnsupportedConfig as exc:
                reason = str(exc)
        if reason is not None:
            self._record(trial, TrialResult(outcomes.UNSUPPORTED, reason))

    def _reuse(self, trial: optuna.Trial, cfg: TrainConfig) -> TrialResult | None:
        """TPE re-proposes configurations it has seen; a deterministic outcome is not re-run."""
        key = config_key(cfg)
        for done in trial.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if done.user_attrs.get("config") is not None and config_key(TrainConfig.from_dict(done.user_attrs["config"])) == key:
                trial.set_user_attr("duplicate_of", done.number)
                m = done.user_attrs.get("measurement")
                return TrialResult(done.user_attrs["outcome"], done.user_attrs.get("reason"), m)
        return None

    def _run(self, trial: optuna.Trial, cfg: TrainConfig) -> TrialResult:
        if self.on_running:
            self.on_running(trial.number, cfg)
        try:
            return run_trial(self.ctx.spec, cfg, timeout_s=self.ctx.trial_timeout_s, device=self.ctx.device,
                             env=self.trial_env, on_start=lambda pid: trial.set_user_attr("trial_pid", pid))
        except KeyboardInterrupt:
            trial.set_user_attr("outcome", outcomes.INTERRUPTED)
            trial.set_user_attr("reason", "stopped by the user (Ctrl-C); the trial's processes were killed")
            raise

    def _record(self, trial: optuna.Trial, result: TrialResult) -> float:
        trial.set_user_attr("outcome", result.outcome)
        if result.reason:
            trial.set_user_attr("reason", result.reason[:REASON_LIMIT])
        m = result.measurement
        if m:
            trial.set_user_attr("measurement", m)
            trial.set_user_attr("tokens_per_sec", m.get("tokens_per_sec"))
            trial.set_user_attr("peak_memory_bytes", m.get("peak_memory_bytes"))
        if result.phase_s:
            trial.set_user_attr("phase_s", result.phase_s)
            trial.set_user_attr("wall_s", result.wall_s)
        limit = self.ctx.memory_limit_bytes
        if result.outcome in outcomes.MEASURED and result.tokens_per_sec is not None:
            peak = result.peak_memory_bytes
            trial.set_constraint("memory", (peak - limit) / limit if peak is not None else 0.0)
            return float(result.tokens_per_sec)
        if result.outcome in outcomes.INFEASIBLE:
            # oom, or over_memory_limit without a rate (the runner's RSS watchdog stopped it early)
            trial.set_constraint("memory", 1.0)
            return 0.0
        if result.outcome == outcomes.UNSUPPORTED:
            raise optuna.TrialPruned(result.reason)
        raise TrialFailed(f"{result.outcome}: {(result.reason or '').splitlines()[0] if result.reason else ''}")


# --- after a kill ----------------------------------------------------------------------------


def fail_orphaned_trials(study: optuna.Study) -> list[int]:
    """RUNNING trials left by a tuner of this host that is gone (killed with -9, power cut)
    are failed now (outcome interrupted), without waiting for the heartbeat grace period,
    and retried once. The journal file has no heartbeats: this is what unsticks it."""
    failed = []
    host = socket.gethostname()
    storage = study._storage
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        pid = t.user_attrs.get("tuner_pid")
        if t.user_attrs.get("host") != host or pid is None or (process_alive(pid) and pid != os.getpid()):
            continue
        try:
            storage.set_trial_user_attr(t._trial_id, "outcome", outcomes.INTERRUPTED)
            storage.set_trial_user_attr(t._trial_id, "reason", "its tuner process was killed; failed at resume")
            storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
        failed.append(t.number)
        # Retried once, as a heartbeat-stale trial is (reference trials too: without them
        # the study would never report its speedups).
        RetryStaleTrial(max_retry=1)(study, storage.get_trial(t._trial_id))
    return failed


# --- reading a study -------------------------------------------------------------------------


@dataclass
class StudySummary:
    name: str
    best: FrozenTrial | None
    baseline: FrozenTrial | None
    checklist: FrozenTrial | None
    counts: dict[str, int] = field(default_factory=dict)
    trials: list[FrozenTrial] = field(default_factory=list)

    def speedup(self, reference: FrozenTrial | None) -> float | None:
        if self.best is None or reference is None:
            return None
        ref = tokens_per_sec(reference)
        return tokens_per_sec(self.best) / ref if ref else None

    @property
    def no_best_reason(self) -> str:
        """Why there is no best: every trial that got as far as memory broke the limit, or no
        trial got that far (all crashed, timed out or unsupported: the limit is not the cause)."""
        measured = sum(self.counts.get(o, 0) for o in (*outcomes.MEASURED, *outcomes.INFEASIBLE))
        return "no trial fits the memory limit" if measured else "no trial finished a measurement"


def tokens_per_sec(trial: FrozenTrial) -> float | None:
    return trial.user_attrs.get("tokens_per_sec")


def is_feasible_ok(trial: FrozenTrial) -> bool:
    return (trial.state == TrialState.COMPLETE and trial.user_attrs.get("outcome") == outcomes.OK
            and all(v <= 0 for v in (trial.constraints or {}).values()))


def summarize(study: optuna.Study) -> StudySummary:
    trials = study.get_trials(deepcopy=False)
    feasible = [t for t in trials if is_feasible_ok(t)]
    best = max(feasible, key=lambda t: t.value) if feasible else None
    counts: dict[str, int] = {}
    for t in trials:
        outcome = t.user_attrs.get("outcome") or ("running" if t.state == TrialState.RUNNING else t.state.name.lower())
        counts[outcome] = counts.get(outcome, 0) + 1

    def reference(name: str) -> FrozenTrial | None:
        # measured: ok, or over the limit with a rate (not one the RSS watchdog stopped early)
        done = [t for t in trials if t.user_attrs.get("reference") == name
                and t.user_attrs.get("outcome") in outcomes.MEASURED and tokens_per_sec(t) is not None]
        return done[0] if done else None

    return StudySummary(study.study_name, best, reference(BASELINE), reference(CHECKLIST), counts, trials)
