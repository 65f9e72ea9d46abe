"""Every figure as people read it, formatted once: rates, percentages, ratios, sizes, knob
values, outcome counts and tables (plain and Markdown). Torch-free, like all of `present`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from autotune import registry
from autotune.errors import printable
from autotune.units import format_bytes

if TYPE_CHECKING:
    from autotune.study.record import TrialRecord

__all__ = [
    "config_summary",
    "counts_text",
    "device_memory_text",
    "format_bytes",
    "format_pct",
    "format_rate",
    "rate_with_interval",
    "several_ranks",
    "shown_config",
    "energy_text",
    "format_ratio",
    "flag_unstable",
    "markdown_table",
    "memory_text",
    "printable",
    "table",
    "value_text",
]


def format_rate(value: float | None) -> str:
    """Tokens/s: 12,345 (no decimals: the spread is larger than a token)."""
    return "n/a" if value is None else f"{value:,.0f}"


def rate_with_interval(value: float | None, interval: Sequence[float] | None) -> str:
    """Tokens/s with its 95 % interval: "12,345 (95%: 12,100-12,600)"; the rate alone when the
    run had too few independent steps for an interval."""
    if value is None or not interval:
        return format_rate(value)
    return f"{format_rate(value)} (95%: {format_rate(interval[0])}-{format_rate(interval[1])})"


def energy_text(joules_per_token: float | None, note: str | None = None, source: str | None = None) -> str:
    """ "2.41 mJ/token (415 tokens/J, nvml-device)", or n/a with the reason."""
    if joules_per_token is None:
        return f"n/a ({note})" if note else "n/a"
    where = f", {source}" if source else ""
    return f"{1000 * joules_per_token:.3g} mJ/token ({1 / joules_per_token:,.0f} tokens/J{where})"


def flag_unstable(text: str, unstable: bool | None) -> str:
    """`text`, marked when the run behind the figure was unstable (its step times varied by
    more than the 5 % coefficient-of-variation target, even over a second window): the figure
    is less sure than the others, and a recipe built on it should be verified."""
    return f"{text} (unstable)" if unstable else text


def format_pct(value: float | None, digits: int = 1) -> str:
    """A fraction as a percentage: 0.123 -> 12.3%."""
    return "n/a" if value is None else f"{100 * value:.{digits}f}%"


def format_ratio(value: float | None) -> str:
    """A speedup or a measured/recorded ratio: 2.5 -> 2.50x."""
    return "n/a" if value is None else f"{value:.2f}x"


def value_text(value: Any) -> str:
    """A knob value in a table: lists as 0,1,2 (empty: -), None as -, booleans lower case."""
    if isinstance(value, list | tuple):
        return ",".join(map(str, value)) or "-"
    if value is None:
        return "-"
    return str(value).lower() if isinstance(value, bool) else str(value)


def counts_text(counts: Mapping[str, int]) -> str:
    """Outcome counts, most first, ties by name: "12 ok, 3 oom, 3 timeout"."""
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def memory_text(peak: int | None, limit: int | None) -> str:
    """ "1.50 GiB of 2.00 GiB (75%)", or the peak alone without a limit."""
    if peak is None:
        return "n/a"
    if not limit:
        return format_bytes(peak)
    return f"{format_bytes(peak)} of {format_bytes(limit)} ({100 * peak / limit:.0f}%)"


def device_memory_text(hw: Mapping[str, Any]) -> str:
    if hw.get("total_memory_bytes"):
        return format_bytes(hw["total_memory_bytes"])
    return f"host RAM ({hw['cpu_count']} CPUs)" if hw.get("kind") == "cpu" and hw.get("cpu_count") else "n/a"


# The knobs each task's line always shows, in their short forms (the line people have read
# since the first release); every other knob of the task follows when it is off its default.
_SHOWN_TRAIN = ("amp_dtype", "compile_mode", "sdpa_backend", "token_budget", "batching", "num_workers")
_SHOWN_TRAIN += ("prefetch_factor", "pin_memory", "checkpoint_layers")
_SHOWN_GENERATE = ("batch_size", "kv_cache", "decode_compile", "compile_prefill", "dtype")
_SHOWN_GENERATE += ("prefill_sdpa", "decode_sdpa", "prompt_bucket")


def config_summary(config: Mapping[str, Any]) -> str:
    """Every knob that tells this configuration apart, in one short line: the usual ones in
    their short forms, then each other knob off its default as name=value, in registry order."""
    if "kv_cache" in config:  # a generation configuration
        return generation_config_summary(config)
    parts = [
        f"amp={config['amp_dtype']}",
        f"compile={config['compile_mode']}",
        f"sdpa={config['sdpa_backend']}",
        f"budget={config['token_budget']}",
        f"batching={config['batching']}",
        f"workers={config['num_workers']}",
    ]
    if config.get("prefetch_factor"):
        parts.append(f"prefetch={config['prefetch_factor']}")
    if config.get("pin_memory"):
        parts.append("pin")
    layers = config.get("checkpoint_layers") or []
    parts.append(f"ckpt={','.join(map(str, layers)) if layers else '-'}")
    return " ".join(parts + _changed_knobs(config, registry.TRAIN, _SHOWN_TRAIN))


def several_ranks(config: Mapping[str, Any]) -> bool:
    """Whether a configuration runs on several ranks (parallelism other than none)."""
    return config.get("parallelism", "none") not in ("none", None)


def shown_config(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The knobs of a configuration as people read them: a single-process one without the
    multi-rank knobs (`ranks_only`: parallelism, DDP's and FSDP2's), which do nothing there
    (issue D, #8; the recipe leaves them out alike)."""
    config = dict(config or {})
    if several_ranks(config):
        return config
    return {k: v for k, v in config.items() if not getattr(registry.BY_NAME.get(k), "ranks_only", False)}


def _changed_knobs(config: Mapping[str, Any], task: str, shown: tuple[str, ...]) -> list[str]:
    """name=value for each of the task's knobs not in `shown` that the config sets off its
    default, in registry order; a knob meaningful only with several ranks only when the
    config has them (parallelism other than none)."""
    ranks = several_ranks(config)
    out = []
    for knob in registry.knobs_of(task):
        if knob.name in shown or knob.name not in config or (knob.ranks_only and not ranks):
            continue
        value = config[knob.name]
        if registry.value_text(value) != registry.value_text(knob.default):
            out.append(f"{knob.name}={value_text(value)}")
    return out


def generation_config_summary(config: Mapping[str, Any]) -> str:
    """A generation configuration's knobs, in one short line."""
    compiled = config.get("decode_compile", "none")
    if compiled != "none" and config.get("compile_prefill"):
        compiled += "+prefill"
    sdpa = config.get("decode_sdpa")
    if config.get("prefill_sdpa") != sdpa:
        sdpa = f"{config.get('prefill_sdpa')}/{sdpa}"
    line = (
        f"batch={config.get('batch_size')} cache={config.get('kv_cache')} compile={compiled} "
        f"dtype={config.get('dtype')} sdpa={sdpa} bucket={config.get('prompt_bucket')}"
    )
    return " ".join([line, *_changed_knobs(config, registry.GENERATE, _SHOWN_GENERATE)])


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned text table."""
    # Escaped: a cell may hold a study's name, a path or a reason (see `printable`).
    cells = [[printable(h) for h in headers]] + [[("" if c is None else printable(c)) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    out = []
    for n, row in enumerate(cells):
        out.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(value: Any) -> str:
        return printable(str("" if value is None else value).replace("\n", " ")).replace("|", "\\|")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def figure_text(trial: "TrialRecord") -> str:
    """A trial's tokens/s as the recipe records it: the mean of its runs, with its own run beside
    it where they differ."""
    if not trial.confirmed:
        return format_rate(trial.tokens_per_sec)
    return f"{format_rate(trial.figure)} (mean of {'/'.join(format_rate(r) for r in trial.runs)})"
