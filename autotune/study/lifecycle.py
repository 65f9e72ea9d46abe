"""A study: opening or resuming it (the same task, hardware, model, data and space, or refused),
with many workers racing to make it. What a resumed study keeps (its limit, its timed window)
is the search's to decide (`search.task.resume`); failing a dead tuner's trials too
(`search.run.fail_orphaned_trials`). Importing this module does not import torch.

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

import logging
import os
import socket
import time
from typing import Any, Callable, Protocol

import optuna

from autotune.errors import UsageError
from autotune.study.study_record import StudyRecord
from autotune.trial.processes import process_alive, stops_deferred

log = logging.getLogger(__name__)


class StudyOfTask(Protocol):
    """What opening a study needs of its task (`search.task.Task`)."""

    ranks: int

    def identity(self) -> dict[str, Any]: ...
    def record(self) -> StudyRecord: ...


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
    ctx: StudyOfTask,
    *,
    sampler: Callable[[int | None], optuna.samplers.BaseSampler],
    seed: int | None = None,
    on_create: Callable[[optuna.Study], None] | None = None,
) -> tuple[optuna.Study, bool]:
    """Create the study, or resume it when it was made for the same hardware, model, data
    and space. Returns (study, is_new). `on_create(study)` runs as part of a new study's set-up
    (the reference trials, the tuner's first proposals and a warm start are enqueued there),
    before the study is marked ready. `sampler(seed)` makes the study's sampler (the tuner's:
    `search.task.Task.sampler`).

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
    stored_ranks = StudyRecord.read(study.user_attrs).run.nproc_per_node
    asked_ranks = ctx.ranks
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


def worker_seed(seed: int, n_trials: int, pid: int | None = None) -> int:
    """The sampler seed of a worker joining or resuming a study. Salted with the number of
    trials (a resumed study must not replay the first run's random draws) and the process id
    (workers starting together on one study must not propose the same configurations in
    lockstep)."""
    return (seed * 1_000_003 + n_trials * 7_919 + (os.getpid() if pid is None else pid)) % 2**32


def _set_up(study: optuna.Study, ctx: StudyOfTask, on_create: Callable[[optuna.Study], None] | None = None) -> None:
    attrs = ctx.record().attrs()  # its task's (`search.task`): the one writer of a study's record
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
