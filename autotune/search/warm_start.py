"""`search --warm-start-from REF`: a new study starts from another study's best
configurations that can run here (inside this space, within its rules, supported by this
device), enqueued after the reference trials; what is skipped is logged with the reason."""

from __future__ import annotations

import json
import logging
import warnings
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FixedTrial

from autotune.config import TrainConfig
from autotune.errors import UnsupportedConfig, UsageError
from autotune.knobs.support import check_supported
from autotune.search.planner import config_key
from autotune.search.training import TrainTask
from autotune.space.sampling import outside_reason, params_for, suggest
from autotune.study.record import TrialRecord, read_trials
from autotune.study.storage import load_ref
from autotune.study.study_record import StudyRecord
from autotune.study.urls import redact

log = logging.getLogger(__name__)

DEFAULT_WARM_START_K = 5


def invalid_here(cfg: TrainConfig, ctx: TrainTask) -> tuple[str, dict[str, Any] | None]:
    """('', params) when `cfg` can be tried in this study as it is; else (why not, None)."""
    params = params_for(ctx.space, cfg)
    if params is None:
        return outside_reason(cfg, ctx.space), None
    try:  # the params must reproduce exactly this config, within every dimension's range
        trial = FixedTrial(params)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            again = suggest(ctx.space, trial)
        inside = all(
            trial.distributions[k]._contains(trial.distributions[k].to_internal_repr(v))
            for k, v in params.items()
            if k in trial.distributions
        )
    except (ValueError, UsageError):
        return "outside this search space", None
    if not inside or config_key(again.to_dict()) != config_key(cfg.to_dict()):
        return outside_reason(cfg, ctx.space), None
    rule = ctx.space.violation(cfg)
    if rule is not None:
        return f"breaks a rule of this space ({rule})", None
    try:
        check_supported(cfg, ctx.capabilities)
    except UnsupportedConfig as exc:
        return f"unsupported on this device ({exc.knob})", None
    return "", params


def warm_start_candidates(source: optuna.Study, top_k: int) -> list[TrialRecord]:
    """The source's top-k distinct feasible configurations, best first. Its reference trials are
    left out: the new study measures its own baseline and checklist."""
    ranked = sorted(
        (r for r in read_trials(source) if r.feasible and r.reference is None and r.config is not None),
        key=lambda r: -(r.value or 0.0),
    )
    chosen: list[TrialRecord] = []
    seen: set[str] = set()
    for t in ranked:
        key = json.dumps(t.config, sort_keys=True)
        if key not in seen:
            seen.add(key)
            chosen.append(t)
    return chosen[:top_k]


@dataclass
class WarmStart:
    """The configurations a new study will start from: read and checked before the study is
    created (a source that cannot be read then leaves nothing behind), enqueued as part of
    its set-up."""

    source: str  # the REF, password redacted
    entries: list[tuple[dict[str, Any], int]] = field(default_factory=list)  # (params, source trial number)

    def enqueue(self, study: optuna.Study) -> int:
        for params, number in self.entries:
            study.enqueue_trial(params, user_attrs={"warm_start_from": self.source, "warm_start_trial": number})
        log.info("warm start from %s: enqueued %d configuration(s)", self.source, len(self.entries))
        return len(self.entries)


def plan_warm_start(ref: str, ctx: TrainTask, top_k: int = DEFAULT_WARM_START_K) -> WarmStart:
    """Read the study `ref` names and pick its top-k feasible ok configurations that are valid
    here (in this space, within its rules, supported by this device); the ones skipped, and
    why, are logged. Reads only: UsageError when the source cannot be read."""
    source = load_ref(ref)
    shown = redact(ref)
    about = StudyRecord.read(source.user_attrs)
    for key, theirs, ours in (("model", about.model, ctx.spec.model), ("seq_len", about.seq_len, ctx.space.seq_len)):
        if theirs is not None and theirs != ours:
            log.warning("warm start from %s: it was made for %s %s, this study is %s", shown, key, theirs, ours)
    skipped: dict[str, list[int]] = {}
    plan = WarmStart(shown)
    for trial in warm_start_candidates(source, top_k):
        try:
            cfg = TrainConfig.from_dict(trial.config)
        except UsageError as exc:
            skipped.setdefault(f"unreadable config ({exc})", []).append(trial.number)
            continue
        reason, params = invalid_here(cfg, ctx)
        if params is None:
            skipped.setdefault(reason, []).append(trial.number)
            continue
        plan.entries.append((params, trial.number))
    if skipped:
        log.warning(
            "warm start from %s: skipped %d of its best: %s",
            shown,
            sum(map(len, skipped.values())),
            "; ".join(f"{why} (#{', #'.join(map(str, numbers))})" for why, numbers in skipped.items()),
        )
    return plan
