"""Studies side by side: what was best on each device, what mattered, and how one
device's best did on another. Also `--warm-start-from`: a new study starts from another
study's best configurations that can run here.

A REF names a study: a storage (URL, PATH.db, PATH.journal or journal:PATH) and, when
that storage holds more than one study, `#NAME`:

    studies/gpt2-nvidia-a100.db
    postgresql://tuner@db/autotune#gpt2-h200

Everything here returns data or text; the CLI prints it.
"""

from __future__ import annotations

import json
import logging
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import optuna
from optuna.trial import FixedTrial, FrozenTrial, TrialState

from autotune import outcomes
from autotune.config import KNOBS, TrainConfig
from autotune.errors import UnsupportedConfig, UsageError
from autotune.outcomes import format_bytes
from autotune.storage import open_storage, redact, study_names
from autotune.study import StudySummary, config_key, is_feasible_ok, summarize, tokens_per_sec

log = logging.getLogger(__name__)

# Fewer non-reference trials than this and an importance ranking is noise, not information.
MIN_IMPORTANCE_TRIALS = 4
TOP_IMPORTANCES = 3
DEFAULT_WARM_START_K = 5


# --- naming and loading a study ----------------------------------------------------------------


def split_ref(ref: str) -> tuple[str, str | None]:
    """'PATH.db#study' -> ('PATH.db', 'study'); a REF without '#NAME' -> (ref, None)."""
    base, sep, name = ref.rpartition("#")
    if sep and base and name:
        return base, name
    return ref, None


def load_ref(ref: str) -> optuna.Study:
    """The study a REF names. A storage with several studies needs `#NAME` (UsageError,
    listing them, otherwise)."""
    url, name = split_ref(ref)
    storage = open_storage(url, create=False)
    names = study_names(storage)
    shown = redact(url)
    if not names:
        raise UsageError(f"{shown} holds no study")
    if name is None:
        if len(names) > 1:
            raise UsageError(f"{shown} holds {len(names)} studies; name one as {shown}#NAME: {', '.join(names)}")
        name = names[0]
    elif name not in names:
        raise UsageError(f"no study {name!r} in {shown}; it holds: {', '.join(names)}")
    return optuna.load_study(study_name=name, storage=storage)


# --- facts about one study ---------------------------------------------------------------------


@dataclass
class Importance:
    """Knob importances (fractions summing to 1), or why there are none."""

    values: dict[str, float] | None
    n_trials: int
    note: str | None = None

    def top(self, n: int = TOP_IMPORTANCES) -> list[tuple[str, float]]:
        return sorted((self.values or {}).items(), key=lambda kv: -kv[1])[:n]


def importance_trials(trials: Iterable[FrozenTrial]) -> list[FrozenTrial]:
    """COMPLETE trials the sampler chose (references carry no params) and that were
    run, not reused: a duplicate would count one measurement twice."""
    return [t for t in trials if t.state == TrialState.COMPLETE and not t.user_attrs.get("reference")
            and "duplicate_of" not in t.user_attrs and t.params]


def knob_importance(trials: Sequence[FrozenTrial]) -> Importance:
    """Optuna's default importance evaluator (PED-ANOVA in Optuna 5: deterministic, needs
    no scikit-learn) over the knobs every chosen trial has and that took more than one value."""
    chosen = importance_trials(trials)
    if len(chosen) < MIN_IMPORTANCE_TRIALS:
        return Importance(None, len(chosen), f"too few trials ({len(chosen)} searched, need {MIN_IMPORTANCE_TRIALS})")
    common = set.intersection(*(set(t.params) for t in chosen))
    params = sorted(p for p in common if len({json.dumps(t.params[p]) for t in chosen}) > 1)
    if not params:
        return Importance(None, len(chosen), "no knob took more than one value")
    if len(params) == 1:
        return Importance({params[0]: 1.0}, len(chosen))
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "new study created in memory" line
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # experimental-feature notices
            scratch = optuna.create_study(direction="maximize")
            scratch.add_trials(chosen)
            values = optuna.importance.get_param_importances(scratch, params=params)
    except Exception as exc:  # an evaluator's limits (too few distinct values, ...) are not the user's error
        log.info("knob importance failed: %s", exc)
        return Importance(None, len(chosen), f"unavailable ({type(exc).__name__}: {str(exc)[:100]})")
    finally:
        optuna.logging.set_verbosity(verbosity)
    return Importance({k: float(v) for k, v in values.items()}, len(chosen))


@dataclass
class StudyView:
    """One study, read once: its summary, hardware and knob importances."""

    label: str
    ref: str  # redacted
    study: optuna.Study
    summary: StudySummary
    importance: Importance

    @property
    def attrs(self) -> dict[str, Any]:
        return self.study.user_attrs

    @property
    def hardware(self) -> dict[str, Any]:
        return self.attrs.get("hardware") or {}

    @property
    def best_config(self) -> dict[str, Any] | None:
        return self.summary.best.user_attrs.get("config") if self.summary.best else None

    @property
    def best_measurement(self) -> dict[str, Any]:
        return (self.summary.best.user_attrs.get("measurement") or {}) if self.summary.best else {}

    @property
    def torch_version(self) -> str | None:
        software = (self.attrs.get("autotune") or {}).get("software") or {}
        return self.hardware.get("torch") or software.get("torch")


def view_study(study: optuna.Study, ref: str, label: str | None = None) -> StudyView:
    summary = summarize(study)
    return StudyView(label or study.study_name, redact(ref), study, summary, knob_importance(summary.trials))


# --- the same configuration elsewhere ----------------------------------------------------------


def normalized(config: dict[str, Any]) -> dict[str, Any]:
    """A config dict comparable across studies (tuples and lists alike, missing knobs as defaults)."""
    try:
        return TrainConfig.from_dict(config).to_dict()
    except UsageError:  # a config from another autotune version: compare what is there
        return {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()}


def differing_knobs(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    a, b = normalized(a), normalized(b)
    order = list(KNOBS) + sorted((set(a) | set(b)) - set(KNOBS))
    return [k for k in order if (k in a or k in b) and a.get(k) != b.get(k)]


@dataclass
class CrossResult:
    """How study `source`'s best configuration did in study `target`."""

    source: str
    target: str
    source_trial: int
    match: str  # "exact", "nearest" or "none"
    trial: int | None = None
    outcome: str | None = None
    tokens_per_sec: float | None = None
    relative_to_best: float | None = None  # against the target study's own best
    differs: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def text(self) -> str:
        """E.g. "a's best (#2) in b: nearest #3, differs in sdpa_backend: 934 tok/s (0.84x b's best)"."""
        head = f"{self.source}'s best (#{self.source_trial}) in {self.target}: "
        if self.match == "none":
            return head + "nothing comparable measured there"
        if self.outcome in outcomes.MEASURED and self.tokens_per_sec is not None:
            rate = f"{self.tokens_per_sec:,.0f} tok/s" + ("" if self.outcome == outcomes.OK else f", {self.outcome}")
        else:
            rate = self.outcome or "?"
        if self.relative_to_best is not None:
            rate += f" ({self.relative_to_best:.2f}x {self.target}'s best)"
        if self.match == "exact":
            return head + f"same configuration, #{self.trial}: {rate}"
        return head + f"nearest: #{self.trial}, differs in {', '.join(self.differs)}: {rate}"


def _finished_with_config(trials: Iterable[FrozenTrial]) -> list[FrozenTrial]:
    return [t for t in trials if t.user_attrs.get("config") is not None and t.user_attrs.get("outcome")
            and t.user_attrs.get("outcome") != outcomes.INTERRUPTED]


def cross_apply(source: StudyView, target: StudyView) -> CrossResult | None:
    """The exact configuration when `target` ran it (a measured run preferred to, e.g., an
    OOM), else the measured trial that differs from it in the fewest knobs."""
    if source.summary.best is None:
        return None
    config = normalized(source.best_config)
    result = CrossResult(source.label, target.label, source.summary.best.number, "none")
    candidates = _finished_with_config(target.summary.trials)
    exact = [t for t in candidates if normalized(t.user_attrs["config"]) == config]
    measured = [t for t in candidates if t.user_attrs["outcome"] in outcomes.MEASURED]
    if exact:
        trial = max(exact, key=lambda t: (t.user_attrs["outcome"] in outcomes.MEASURED, tokens_per_sec(t) or 0.0))
        result.match = "exact"
    elif measured:
        trial = min(measured, key=lambda t: (len(differing_knobs(config, t.user_attrs["config"])), not is_feasible_ok(t),
                                             -(tokens_per_sec(t) or 0.0)))
        result.match = "nearest"
        result.differs = differing_knobs(config, trial.user_attrs["config"])
    else:
        return result
    result.trial, result.outcome = trial.number, trial.user_attrs["outcome"]
    if trial.user_attrs["outcome"] in outcomes.MEASURED:
        result.tokens_per_sec = tokens_per_sec(trial)
    best = target.summary.best
    if best is not None and result.tokens_per_sec is not None and tokens_per_sec(best):
        result.relative_to_best = result.tokens_per_sec / tokens_per_sec(best)
    return result


# --- the comparison ----------------------------------------------------------------------------


@dataclass
class Comparison:
    views: list[StudyView]
    knobs: list[str]  # knobs of the best configurations, in KNOBS order
    differ: list[str]  # those whose best value is not the same in every study
    cross: list[CrossResult]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "studies": [_view_dict(v) for v in self.views],
            "knobs": {"all": self.knobs, "differ": self.differ},
            "cross": [c.to_dict() for c in self.cross],
            "notes": self.notes,
        }


def load_comparison(refs: Sequence[str]) -> Comparison:
    """Load every REF and compare them. Studies with one name get their REF as the label."""
    studies = [(ref, load_ref(ref)) for ref in refs]
    names = [s.study_name for _, s in studies]
    views = [view_study(s, ref, label=s.study_name if names.count(s.study_name) == 1 else redact(ref))
             for ref, s in studies]
    return compare_views(views)


def compare_views(views: list[StudyView]) -> Comparison:
    configs = [normalized(v.best_config) for v in views if v.best_config is not None]
    knobs = [k for k in KNOBS if any(k in c for c in configs)]
    differ = [k for k in knobs if len({json.dumps(c.get(k), sort_keys=True) for c in configs}) > 1]
    cross = [r for s in views for t in views if s is not t for r in [cross_apply(s, t)] if r is not None]
    return Comparison(views, knobs, differ, cross, comparability_notes(views))


def comparability_notes(views: Sequence[StudyView]) -> list[str]:
    """Tokens/s compare across devices only for the same model, data and context length."""
    notes = []
    for key, what in (("model", "models"), ("data", "data"), ("seq_len", "context lengths")):
        values = {str(v.attrs[key]) for v in views if v.attrs.get(key) is not None}
        if len(values) > 1:
            notes.append(f"the studies tuned different {what} ({', '.join(sorted(values))}): "
                         "their tokens/s are not directly comparable")
    return notes


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def value_text(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(map(str, value)) or "-"
    if value is None:
        return "-"
    return str(value).lower() if isinstance(value, bool) else str(value)


def counts_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def memory_text(peak: int | None, limit: int | None) -> str:
    if peak is None:
        return "n/a"
    if not limit:
        return format_bytes(peak)
    return f"{format_bytes(peak)} of {format_bytes(limit)} ({100 * peak / limit:.0f}%)"


def device_memory_text(hw: dict[str, Any]) -> str:
    if hw.get("total_memory_bytes"):
        return format_bytes(hw["total_memory_bytes"])
    return f"host RAM ({hw['cpu_count']} CPUs)" if hw.get("kind") == "cpu" and hw.get("cpu_count") else "n/a"


def comparison_rows(comp: Comparison) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of the side-by-side table: one column per study."""
    views = comp.views
    rows: list[list[str]] = []

    def row(label: str, cells: Iterable[str]) -> None:
        rows.append([label, *cells])

    row("storage", (v.ref for v in views))
    row("device", (v.hardware.get("name", "?") for v in views))
    row("device memory", (device_memory_text(v.hardware) for v in views))
    row("torch", (v.torch_version or "?" for v in views))
    if any(v.hardware.get("cuda") for v in views):
        row("CUDA / driver", (f"{v.hardware.get('cuda') or '-'} / {v.hardware.get('driver') or '-'}" for v in views))
    row("model", (f"{v.attrs.get('model', '?')} (seq {v.attrs.get('seq_len', '?')})" for v in views))
    row("best trial", (f"#{v.summary.best.number}" if v.summary.best else "none within the limit" for v in views))
    row("effective tokens/s", (f"{tokens_per_sec(v.summary.best):,.0f}" if v.summary.best else "n/a" for v in views))
    row("MFU", (_pct(v.best_measurement.get("mfu")) for v in views))
    row("peak memory / limit", (memory_text(v.best_measurement.get("peak_memory_bytes"), v.attrs.get("memory_limit_bytes"))
                                 for v in views))
    row("speedup vs baseline", (_ratio(v.summary.speedup(v.summary.baseline)) for v in views))
    row("speedup vs checklist", (_ratio(v.summary.speedup(v.summary.checklist)) for v in views))
    for knob in comp.knobs:
        mark = "* " if knob in comp.differ else "  "
        row(f"{mark}{knob}", (value_text(normalized(v.best_config).get(knob)) if v.best_config else "-" for v in views))
    for i in range(TOP_IMPORTANCES):
        cells = []
        for v in views:
            top = v.importance.top()
            if v.importance.values is None:
                cells.append((v.importance.note or "n/a") if i == 0 else "")
            else:
                cells.append(f"{top[i][0]} ({100 * top[i][1]:.0f}%)" if i < len(top) else "")
        row(f"important knob {i + 1}", cells)
    row("trials", (f"{len(v.summary.trials)}: {counts_text(v.summary.counts)}" if v.summary.trials else "0"
                   for v in views))
    return ["", *[v.label for v in views]], rows


def _differ_note(comp: Comparison) -> str:
    if comp.differ:
        return "* the best value of this knob differs between the studies"
    if sum(v.best_config is not None for v in comp.views) > 1:
        return "the best configurations agree on every knob"
    return ""


def cross_lines(comp: Comparison) -> list[str]:
    no_best = [f"{v.label} has no best (no trial within its memory limit) to try elsewhere" for v in comp.views
               if v.summary.best is None]
    return [c.text() for c in comp.cross] + no_best


def comparison_text(comp: Comparison) -> str:
    from autotune.render import table

    headers, rows = comparison_rows(comp)
    out = [table(headers, rows), "", _differ_note(comp)] + [f"note: {n}" for n in comp.notes]
    if len(comp.views) > 1:
        out += ["", "each best configuration in the other studies:"] + [f"  {line}" for line in cross_lines(comp)]
    return "\n".join(out)


def comparison_markdown(comp: Comparison) -> str:
    headers, rows = comparison_rows(comp)
    rows = [[(f"**{r[0].strip()[2:]}** \\*" if r[0].startswith("* ") else r[0].strip()), *r[1:]] for r in rows]
    out = [markdown_table(headers, rows), "", _differ_note(comp).replace("* ", "\\* ", 1)]
    out += [f"\n**Note:** {n}" for n in comp.notes]
    if len(comp.views) > 1:
        out += ["", "Each best configuration in the other studies:", ""] + [f"- {line}" for line in cross_lines(comp)]
    return "\n".join(out) + "\n"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(value: Any) -> str:
        return str("" if value is None else value).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _view_dict(v: StudyView) -> dict[str, Any]:
    best = v.summary.best
    m = v.best_measurement
    return {
        "label": v.label,
        "study": v.study.study_name,
        "storage": v.ref,
        "hardware": v.hardware,
        "torch": v.torch_version,
        "model": v.attrs.get("model"),
        "seq_len": v.attrs.get("seq_len"),
        "memory_limit_bytes": v.attrs.get("memory_limit_bytes"),
        "best": None if best is None else {
            "trial": best.number, "config": normalized(v.best_config), "tokens_per_sec": tokens_per_sec(best),
            "mfu": m.get("mfu"), "peak_memory_bytes": m.get("peak_memory_bytes"),
        },
        "speedup_vs_baseline": v.summary.speedup(v.summary.baseline),
        "speedup_vs_checklist": v.summary.speedup(v.summary.checklist),
        "importance": v.importance.values,
        "importance_note": v.importance.note,
        "importance_trials": v.importance.n_trials,
        "counts": v.summary.counts,
        "n_trials": len(v.summary.trials),
    }


# --- warm start --------------------------------------------------------------------------------


def invalid_here(cfg: TrainConfig, ctx) -> tuple[str, dict[str, Any] | None]:
    """('', params) when `cfg` can be tried in this study as it is; else (why not, None)."""
    from autotune.knobs import DeviceCapabilities, check_supported

    params = ctx.space.params_for(cfg)
    if params is None:
        return outside_reason(cfg, ctx.space), None
    try:  # the params must reproduce exactly this config, within every dimension's range
        trial = FixedTrial(params)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            again = ctx.space.suggest(trial)
        inside = all(trial.distributions[k]._contains(trial.distributions[k].to_internal_repr(v))
                     for k, v in params.items() if k in trial.distributions)
    except (ValueError, UsageError):
        return "outside this search space", None
    if not inside or config_key(again) != config_key(cfg):
        return outside_reason(cfg, ctx.space), None
    rule = ctx.space.violation(cfg)
    if rule is not None:
        return f"breaks a rule of this space ({rule})", None
    try:
        check_supported(cfg, DeviceCapabilities.detect(ctx.device.kind, ctx.device.capability_tuple))
    except UnsupportedConfig as exc:
        return f"unsupported on this device ({exc.knob})", None
    return "", params


def outside_reason(cfg: TrainConfig, space) -> str:
    """Which knob puts `cfg` outside `space`, as far as can be said simply."""
    values = cfg.to_dict()
    for knob, value in space.fixed.items():
        if values.get(knob) != value:
            return f"outside this search space (it fixes {knob}={value_text(value)})"
    for name, dim in space.dimensions.items():
        value = values.get(name)
        if dim.choices is not None and value not in dim.choices and (not dim.when or space._matches(dim.when, values)):
            return f"outside this search space ({name} not among {', '.join(map(value_text, dim.choices))})"
        if dim.choices is None and isinstance(value, int):
            high = space.n_layer if dim.high == "n_layer" else dim.high
            if not dim.low <= value <= high or (value - dim.low) % dim.step:
                return f"outside this search space ({name} not in {dim.low}..{high} step {dim.step})"
    return "outside this search space"


def warm_start_candidates(source: optuna.Study, top_k: int) -> list[FrozenTrial]:
    """The source's top-k distinct feasible ok configurations, best first. Its reference
    trials are left out: the new study measures its own baseline and checklist."""
    ranked = sorted((t for t in source.get_trials(deepcopy=False) if is_feasible_ok(t) and not t.user_attrs.get("reference")
                     and t.user_attrs.get("config") is not None), key=lambda t: -(t.value or 0.0))
    chosen: list[FrozenTrial] = []
    seen: set[str] = set()
    for t in ranked:
        key = json.dumps(normalized(t.user_attrs["config"]), sort_keys=True)
        if key not in seen:
            seen.add(key)
            chosen.append(t)
    return chosen[:top_k]


def enqueue_warm_start(study: optuna.Study, ref: str, ctx, top_k: int = DEFAULT_WARM_START_K) -> int:
    """Enqueue the top-k feasible ok configurations of the study `ref` names that are valid
    here (in this space, within its rules, supported by this device). Returns how many were
    enqueued; the ones skipped, and why, are logged. They run after the reference trials."""
    source = load_ref(ref)
    shown = redact(ref)
    for key in ("model", "seq_len"):
        theirs, ours = source.user_attrs.get(key), (ctx.spec.model if key == "model" else ctx.space.seq_len)
        if theirs is not None and theirs != ours:
            log.warning("warm start from %s: it was made for %s %s, this study is %s", shown, key, theirs, ours)
    skipped: dict[str, list[int]] = {}
    enqueued = 0
    for trial in warm_start_candidates(source, top_k):
        try:
            cfg = TrainConfig.from_dict(trial.user_attrs["config"])
        except UsageError as exc:
            skipped.setdefault(f"unreadable config ({exc})", []).append(trial.number)
            continue
        reason, params = invalid_here(cfg, ctx)
        if params is None:
            skipped.setdefault(reason, []).append(trial.number)
            continue
        study.enqueue_trial(params, user_attrs={"warm_start_from": shown, "warm_start_trial": trial.number})
        enqueued += 1
    log.info("warm start from %s: enqueued %d configuration(s)", shown, enqueued)
    if skipped:
        log.warning("warm start from %s: skipped %d of its best: %s", shown, sum(map(len, skipped.values())),
                    "; ".join(f"{why} (#{', #'.join(map(str, numbers))})" for why, numbers in skipped.items()))
    return enqueued
