"""A study: opening or resuming it (the same hardware, model, data and space, or refused; the
same rules of measurement, or refused), its identity and attributes, the sampler, failing a
dead tuner's trials, and reading it back as a `StudySummary`. Importing this module does not
import torch: `show` and `compare` read studies through it.

A resumed study keeps its rules: its memory limit, its global batch (--global-batch-tokens)
and the timed window (--steps, --min-time) every trial was measured with. A run asking for
others is refused with the difference named (`check_rules`); the memory limit and the global
batch are taken from the study when the run does not set them. Trials measured under
different rules are never mixed in one study.

How a trial is recorded, by outcome (decided in `measure.outcomes.recording`):

    ok, over_memory_limit   COMPLETE, value = tokens/s, constraint from the measured peak
    oom                     COMPLETE, value = 0, constraint 1 (infeasible)
                            (so is over_memory_limit stopped early by the CPU RSS watchdog)
    predicted_over_limit    COMPLETE, value = 0, constraint from the predicted peak; not run
                            (search.memory_model; user attrs predicted_peak_bytes, memory_basis)
    unsupported             PRUNED before any process starts (or after the run said so)
    timeout, crashed        FAIL, with the reason
    interrupted             FAIL (Ctrl-C), with the reason

Every trial carries readable user attrs: outcome, reason, config, tokens_per_sec,
peak_memory_bytes and the whole measurement, so optuna-dashboard shows them as they are.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any, Callable

import optuna
from optuna.trial import TrialState

from autotune.config import RunSpec
from autotune.device.info import DeviceInfo, software_versions
from autotune.errors import UsageError
from autotune.knobs.support import DeviceCapabilities
from autotune.measure import outcomes
from autotune.model.sizes import ModelDims
from autotune.space.definition import SearchSpace
from autotune.study import leaders
from autotune.study.storage import RetryStaleTrial, internals
from autotune.trial.processes import process_alive, stops_deferred
from autotune.units import format_bytes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StudyContext:
    """Everything that must stay the same for the trials of one study to be comparable."""

    spec: RunSpec
    device: DeviceInfo
    space: SearchSpace
    memory_limit_bytes: int
    trial_timeout_s: float
    # Feasible only with a worst-case peak <= limit x (1 - headroom) (outcomes.memory_constraint)
    memory_headroom: float = outcomes.DEFAULT_MEMORY_HEADROOM
    objective: str = leaders.DEFAULT_OBJECTIVE  # what the study maximizes (study.leaders.OBJECTIVES)
    model_dims: ModelDims | None = None  # for the expert start's budget estimate; None when unknown

    def __post_init__(self) -> None:
        # The run judges feasibility itself (outcomes.decide_measured): it gets the study's headroom.
        if self.spec.memory_headroom != self.memory_headroom:
            object.__setattr__(self, "spec", dataclasses.replace(self.spec, memory_headroom=self.memory_headroom))

    @property
    def capabilities(self) -> DeviceCapabilities:
        return DeviceCapabilities.detect(self.device.kind, self.device.capability_tuple)

    def attrs(self) -> dict[str, Any]:
        """The study attrs a new study of this context is given (its identity among them)."""
        return study_attrs(self)

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
    return {
        "autotune": {"kind": "search", "software": software_versions()},
        "hardware": ctx.device.to_dict(),
        "model": ctx.spec.model,
        "data": ctx.spec.data,
        "seq_len": ctx.space.seq_len,
        "n_layer": ctx.space.n_layer,
        "memory_limit_bytes": ctx.memory_limit_bytes,
        "memory_headroom": ctx.memory_headroom,
        "objective": ctx.objective,
        "space": ctx.space.to_dict(),
        "space_source": ctx.space.source,
        "space_hash": ctx.space.hash,
        "identity": ctx.identity(),
        "run": {
            "warmup": ctx.spec.warmup,
            "steps": ctx.spec.steps,
            "min_time_s": ctx.spec.min_time_s,
            "seed": ctx.spec.seed,
            "global_batch_tokens": ctx.spec.global_batch_tokens,
            # several ranks a trial (`--nproc-per-node`); a single-process study's attrs read as they always have
            **({"nproc_per_node": ranks} if (ranks := getattr(ctx.spec, "nproc_per_node", 1)) > 1 else {}),
        },
    }


# A study is ready once its identity attr is written. Its creator writes every other attr and
# enqueues the reference trials first, so a worker that sees the identity also sees them.
READY_ATTR = "identity"
# Written first, right after the study is created: who is setting it up. A worker that finds
# a study not ready while its creator (on this host) is gone sets it up at once, not after
# JOIN_WAIT_S.
CREATOR_ATTR = "creator"
JOIN_WAIT_S = 30.0  # how long a joining worker waits for the creator to finish setting up
JOIN_POLL_S = 0.2
_pause = time.sleep  # a name of its own: tests count the waits instead of timing them


def open_study(
    name: str,
    storage,
    ctx: StudyContext,
    *,
    sampler: Callable[[int | None], optuna.samplers.BaseSampler],
    seed: int | None = None,
    on_create: Callable[[optuna.Study], None] | None = None,
) -> tuple[optuna.Study, bool]:
    """Create the study, or resume it when it was made for the same hardware, model, data
    and space. Returns (study, is_new). `on_create(study)` runs as part of a new study's set-up
    (the reference trials, the tuner's first proposals and a warm start are enqueued there),
    before the study is marked ready. `sampler(seed)` makes the study's sampler (the tuner's:
    `search.sampler.make_sampler`).

    Race-free with many workers: only the one whose `create_study` succeeds sets the study
    up and runs `on_create`; the others get DuplicatedStudyError, load it and wait until it is
    ready. (load_if_exists would let two new workers both see an empty study and both enqueue
    the references.) A stop signal (Ctrl-C, SIGTERM) during creation
    and set-up waits until they are done: a study is never left half made."""
    with stops_deferred():
        try:
            study = optuna.create_study(study_name=name, storage=storage, direction="maximize", sampler=sampler(seed))
        except optuna.exceptions.DuplicatedStudyError:
            study = optuna.load_study(study_name=name, storage=storage, sampler=sampler(seed))
        else:
            study.set_user_attr(CREATOR_ATTR, {"host": socket.gethostname(), "pid": os.getpid()})
            _set_up(study, ctx, on_create)
            return study, True
    existing = _wait_until_ready(study)
    if existing is None:
        if study.trials:
            raise UsageError(
                f"study {name!r} exists but was not made by `autotune search` (it has no identity): "
                f"choose another name with --study"
            )
        # Created, then its creator stopped before setting it up: finish the job.
        log.warning("study %r was created but never set up (its creator stopped early): setting it up now", name)
        with stops_deferred():
            _set_up(study, ctx, on_create)
        return study, True
    if seed is not None:
        study.sampler = sampler(worker_seed(seed, len(study.trials)))
    # The ranks first: a study of another rank count has another default space, and its hash
    # says nothing of why.
    stored_ranks = (study.user_attrs.get("run") or {}).get("nproc_per_node", 1)
    asked_ranks = getattr(ctx.spec, "nproc_per_node", 1)  # a generation study: one process
    if stored_ranks != asked_ranks:
        raise UsageError(
            f"study {name!r} was measured with --nproc-per-node {stored_ranks}, this run {asked_ranks}: tokens/s of "
            f"{stored_ranks} rank(s) is another figure than of {asked_ranks}. Resume it with --nproc-per-node "
            f"{stored_ranks}, or start a new study (--new-study, or --study NAME)"
        )
    mismatch = _identity_mismatch(existing, ctx.identity())
    if mismatch:
        raise UsageError(
            f"study {name!r} was made for {mismatch[0]}, this run is {mismatch[1]}: "
            f"resume it with the same settings, or choose a new name with --study"
        )
    return study, False


def check_rules(
    study: optuna.Study,
    ctx: StudyContext,
    *,
    limit_given: bool,
    headroom_given: bool = False,
    objective_given: bool = False,
) -> StudyContext:
    """The context to resume `study` with: its own memory limit, headroom and objective when the
    run sets none (`limit_given`, `headroom_given`, `objective_given` False); UsageError when the
    run asks for another limit, headroom or objective, or another timed window (--steps,
    --min-time), than every trial of the study was judged with."""
    attrs = study.user_attrs
    stored_objective = leaders.study_objective(attrs)  # a study made before objectives: tokens/s
    if stored_objective != ctx.objective:
        if objective_given:
            raise UsageError(
                f"study {study.study_name!r} maximizes {stored_objective}, this run asks for {ctx.objective}: "
                "resume it with its objective, or start a new study (--new-study, or --study NAME)"
            )
        ctx = dataclasses.replace(ctx, objective=stored_objective)
    stored_limit = attrs.get("memory_limit_bytes")
    differences = []
    if isinstance(stored_limit, int) and stored_limit != ctx.memory_limit_bytes:
        if limit_given:
            differences.append(
                f"memory limit {format_bytes(stored_limit)} ({stored_limit} bytes), this run "
                f"{format_bytes(ctx.memory_limit_bytes)}"
            )
        else:
            log.info("resuming %r with its memory limit %s", study.study_name, format_bytes(stored_limit))
            ctx = dataclasses.replace(
                ctx,
                memory_limit_bytes=stored_limit,
                spec=dataclasses.replace(ctx.spec, memory_limit_bytes=stored_limit),
            )
    # A study made before headrooms existed judged its trials against the limit itself: 0.
    stored_headroom = attrs.get("memory_headroom", 0.0)
    if stored_headroom != ctx.memory_headroom:
        if headroom_given:
            differences.append(f"--memory-headroom {stored_headroom:.0%}, this run {ctx.memory_headroom:.0%}")
        else:
            log.info("resuming %r with its memory headroom %.0f%%", study.study_name, 100 * stored_headroom)
            ctx = dataclasses.replace(ctx, memory_headroom=stored_headroom)
    run = attrs.get("run") or {}
    # A study made before global batches existed has no key: it measured without accumulation.
    stored_batch, asked_batch = run.get("global_batch_tokens"), ctx.spec.global_batch_tokens
    if asked_batch is None and stored_batch is not None:
        log.info("resuming %r with its global batch of %d tokens", study.study_name, stored_batch)
        ctx = dataclasses.replace(ctx, spec=dataclasses.replace(ctx.spec, global_batch_tokens=stored_batch))
    elif stored_batch != asked_batch:
        differences.append(
            f"--global-batch-tokens {stored_batch if stored_batch is not None else 'unset'}, this run {asked_batch}"
        )
    # Tokens/s of N ranks is another figure than one rank's: a study is measured with one world size.
    stored_ranks, asked_ranks = run.get("nproc_per_node", 1), getattr(ctx.spec, "nproc_per_node", 1)  # generation: 1
    if stored_ranks != asked_ranks:
        differences.append(f"--nproc-per-node {stored_ranks}, this run {asked_ranks}")
    for key, option in (("steps", "--steps"), ("min_time_s", "--min-time")):
        stored, asked = run.get(key), getattr(ctx.spec, key)
        if stored is not None and stored != asked:
            differences.append(f"{option} {stored:g}, this run {asked:g}")
    if differences:
        raise UsageError(
            f"study {study.study_name!r} was measured with {'; '.join(differences)}: trials measured under other "
            "rules cannot be compared. Resume it with its settings, or start a new study (--new-study, or "
            "--study NAME)"
        )
    return ctx


def worker_seed(seed: int, n_trials: int, pid: int | None = None) -> int:
    """The sampler seed of a worker joining or resuming a study. Salted with the number of
    trials (a resumed study must not replay the first run's random draws) and the process id
    (workers starting together on one study must not propose the same configurations in
    lockstep)."""
    return (seed * 1_000_003 + n_trials * 7_919 + (os.getpid() if pid is None else pid)) % 2**32


def _set_up(study: optuna.Study, ctx: StudyContext, on_create: Callable[[optuna.Study], None] | None = None) -> None:
    attrs = ctx.attrs()  # a training study's, or a generation study's (`search.generate`)
    identity = attrs.pop(READY_ATTR)
    for key, value in attrs.items():
        study.set_user_attr(key, value)
    if on_create is not None:
        on_create(study)
    study.set_user_attr(READY_ATTR, identity)  # last: the study is ready


def _wait_until_ready(study: optuna.Study) -> dict[str, Any] | None:
    """The study's identity once its creator has set it up; None after JOIN_WAIT_S, or at once
    when the creator was a process of this host that is gone."""
    deadline = time.monotonic() + JOIN_WAIT_S
    while True:
        attrs = study.user_attrs
        identity = attrs.get(READY_ATTR)
        if identity is not None or time.monotonic() > deadline or _creator_gone(attrs.get(CREATOR_ATTR)):
            return identity
        _pause(JOIN_POLL_S)


def _creator_gone(creator: Any) -> bool:
    if not isinstance(creator, dict) or creator.get("host") != socket.gethostname():
        return False
    pid = creator.get("pid")
    return isinstance(pid, int) and pid != os.getpid() and not process_alive(pid)


def _identity_mismatch(stored: dict[str, Any], current: dict[str, Any]) -> tuple[str, str] | None:
    # Not the device UUID: workers on several GPUs of one model (--devices, a fleet of hosts)
    # feed one study. The device name (model) must match; which unit it is need not.
    labels = {
        "task": "task",
        "model": "model",
        "data": "data",
        "seq_len": "context length",
        "device_name": "device",
        "space_hash": "search space (hash)",
        "workload": "generation workload",  # a generation study's prompts and new tokens
    }
    # A study made before generation studies is a training one (its identity names no task).
    stored, current = {"task": "train", **stored}, {"task": "train", **current}
    for key, label in labels.items():
        if stored.get(key) != current.get(key):
            return f"{label} {stored.get(key)}", f"{label} {current.get(key)}"
    return None


# --- after a kill ----------------------------------------------------------------------------


def fail_orphaned_trials(study: optuna.Study) -> list[int]:
    """RUNNING trials left by a tuner of this host that is gone (killed with -9, power cut)
    are failed now (outcome interrupted), without waiting for the heartbeat grace period,
    and retried once. The journal file has no heartbeats: this is what unsticks it."""
    failed = []
    host = socket.gethostname()
    storage, study_id = internals(study)
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        pid = t.user_attrs.get("tuner_pid")
        if t.user_attrs.get("host") != host or pid is None or (process_alive(pid) and pid != os.getpid()):
            continue
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
        outcome, reason = outcomes.orphaned()
        try:
            storage.set_trial_user_attr(trial_id, "outcome", outcome)
            storage.set_trial_user_attr(trial_id, "reason", reason)
            storage.set_trial_state_values(trial_id, state=TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
        failed.append(t.number)
        # Retried once, as a heartbeat-stale trial is (reference trials too: without them
        # the study would never report its speedups).
        RetryStaleTrial(max_retry=1)(study, storage.get_trial(trial_id))
    return failed
