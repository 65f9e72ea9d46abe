"""`autotune search`'s settings, each declared once: a `SearchSettings` field whose metadata is
its command-line option (`Option`: flags, help, kind). The click options of `autotune search`
and those `bench`, `verify`, `profile` and `doctor` share with it (`cli._options.settings_options`)
and the argv of a `--devices` worker (`worker_argv`) are made from these fields;
tests/search/test_settings.py checks both round-trip.

A worker gets every setting the parent was given (`worker="pass"`), except what the parent
resolves for all workers alike (`worker="parent"`: the study's name, its memory limit in bytes,
the trial timeout, each worker's device and trial count) and what only the study's creator does
(`worker="never"`: a warm start, the references, a new study's name)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from autotune import environment
from autotune.config import (
    MAX_GLOBAL_BATCH_TOKENS,
    MAX_MIN_TIME_S,
    MAX_NEW_TOKENS,
    MAX_NPROC_PER_NODE,
    MAX_SEED,
    MAX_SEQ_LEN,
    MAX_STEPS,
)

PASS, PARENT, NEVER = "pass", "parent", "never"
DEFAULT_TRIAL_CAP = 60  # trials, when --n-trials is not given and the search has not settled
MAX_TRIALS = 1_000_000  # --n-trials: far more than any study runs; beyond it a typo
# What an option's value is, for the command line: click's type there, and how a worker's argv spells it.
KINDS = ("text", "int", "float", "size", "duration", "fraction", "choice", "flag", "off")


@dataclass(frozen=True)
class Option:
    """A setting's command-line option. kind: text, int or float (from `minimum` to `maximum`;
    above `minimum` when `above_minimum`), size (bytes: 60GiB), duration (seconds: 10m),
    fraction (5% or 0.05), choice (one of `choices`), flag (off by default, on when given), off
    (on by default; the flag turns it off)."""

    flag: str
    help: str
    kind: str = "text"
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    above_minimum: bool = False
    envvar: str | None = None
    metavar: str | None = None
    show_default: bool = False
    hidden: bool = False
    worker: str = PASS

    def __post_init__(self) -> None:
        if self.kind not in KINDS or self.worker not in (PASS, PARENT, NEVER):
            raise ValueError(f"option {self.flag}: kind {self.kind!r}, worker {self.worker!r}")
        if self.kind in ("int", "float") and (self.minimum is None or self.maximum is None):
            raise ValueError(f"option {self.flag}: a number needs its range (minimum and maximum)")

    def argv(self, value: Any) -> list[str]:
        """How a worker's command line gives `value` (nothing for a flag left at its default)."""
        if self.kind == "flag":
            return [self.flag] if value else []
        if self.kind == "off":
            return [] if value else [self.flag]
        if self.kind == "duration":
            return [self.flag, f"{value:g}s"]
        if self.kind == "fraction":
            return [self.flag, f"{value:.12f}".rstrip("0").rstrip(".") or "0"]
        return [self.flag, str(value)]


def setting(default: Any, option: Option) -> Any:
    return field(default=default, metadata={"option": option})


@dataclass(frozen=True)
class SearchSettings:
    model: str = setting(
        "gpt2",
        Option(
            "--model",
            "gpt2, gpt2-medium, gpt2-large, gpt2-xl, gpt2-tiny; a Hugging Face model from its config (random "
            "weights, nothing downloaded): hf:gpt2 ... hf:gpt2-xl, hf:gpt2-tiny, hf:llama-tiny, hf:smollm-135m, or "
            "hf:PATH (a local config directory); or package.module:factory.",
            show_default=True,
        ),
    )
    device: str = setting(
        "auto", Option("--device", "auto (CUDA when present), cpu, cuda or cuda:N.", show_default=True, worker=PARENT)
    )
    data: str = setting(
        "synthetic",
        Option("--data", "synthetic, or a PATH.bin (uint16 tokens), PATH.txt or PATH.jsonl file.", show_default=True),
    )
    seq_len: int | None = setting(
        None, Option("--seq-len", "Context length (default: the model's).", "int", minimum=2, maximum=MAX_SEQ_LEN)
    )
    warmup: int = setting(
        3,
        Option(
            "--warmup",
            "Warm-up steps (compile happens here).",
            "int",
            minimum=0,
            maximum=MAX_STEPS,
            show_default=True,
        ),
    )
    steps: int = setting(  # a timed window needs two steps (a median, a spread)
        20, Option("--steps", "Timed steps, at least.", "int", minimum=2, maximum=MAX_STEPS, show_default=True)
    )
    min_time_s: float = setting(
        2.0,
        Option(
            "--min-time",
            "Time the steps for at least this many seconds too (more steps on a fast device).",
            "float",
            minimum=0,
            maximum=MAX_MIN_TIME_S,
            show_default=True,
        ),
    )
    seed: int = setting(  # what numpy's and torch's generators take
        0,
        Option(
            "--seed",
            "Seed for weights and data (and, in search, the sampler).",
            "int",
            minimum=0,
            maximum=MAX_SEED,
            show_default=True,
        ),
    )
    study: str | None = setting(
        None,
        Option("--study", "Study name (default: <model>-<device slug>, e.g. gpt2-nvidia-h200).", worker=PARENT),
    )
    storage: str | None = setting(
        None,
        Option(
            "--storage",
            "Optuna storage URL (default: sqlite:///studies/<study>.db); journal:PATH for one host, many workers; "
            "postgresql://... for many hosts (the environment variable keeps a password off the command line).",
            envvar=environment.STORAGE,
            worker=PARENT,  # in the worker's environment, never its argv (a password would show in ps)
        ),
    )
    space: str | None = setting(
        None, Option("--space", "Search space YAML (default: search_spaces/gpt2.yaml on CUDA, cpu.yaml on CPU).")
    )
    memory_limit_bytes: int | None = setting(
        None,
        Option(
            "--memory-limit",
            "Peak memory a configuration may use, e.g. 60GiB (GPU memory via NVML; peak RSS on CPU).",
            "size",
            worker=PARENT,
        ),
    )
    global_batch_tokens: int | None = setting(
        None,
        Option(
            "--global-batch-tokens",
            "Tokens (positions, padding included) per optimizer step, reached by gradient accumulation over "
            "micro-batches of the token budget, which must divide N (default: one micro-batch per step). tokens/s "
            "counts every micro-step.",
            "int",
            minimum=1,
            maximum=MAX_GLOBAL_BATCH_TOKENS,
            metavar="N",
        ),
    )
    nproc_per_node: int = setting(
        1,
        Option(
            "--nproc-per-node",
            "Ranks per trial, one per GPU of this host (cuda:0 ... cuda:N-1; CUDA_VISIBLE_DEVICES chooses them): "
            "each trial is one launch of N ranks through torch's elastic launcher (what torchrun runs), searching "
            "DDP and FSDP2 (default space search_spaces/gpt2_ddp.yaml; cpu_ddp.yaml on CPU, gloo). tokens/s is "
            "global; --global-batch-tokens is across the ranks; --memory-limit is per device.",
            "int",
            minimum=1,
            maximum=MAX_NPROC_PER_NODE,
            metavar="N",
            show_default=True,
            worker=NEVER,  # --devices runs single-GPU workers: the two are refused together
        ),
    )
    memory_fraction: float | None = setting(
        None,
        Option(
            "--memory-fraction",
            "Limit as a fraction of the device's total memory (default 0.9).",
            "float",
            minimum=0,
            maximum=1,
            above_minimum=True,
            worker=PARENT,
        ),
    )
    memory_headroom: float | None = setting(
        None,
        Option(
            "--memory-headroom",
            "Feasible only if a configuration's worst-case peak is at most the limit less this share of it; "
            "5% or 0.05 (default 5%: fragmentation over hours of training and the evaluation, checkpoint and "
            "communication buffers a tuning run never makes add a few percent). A resumed study keeps its own.",
            "fraction",
        ),
    )
    n_trials: int | None = setting(
        None,
        Option(
            "--n-trials",
            "At most this many trials in this invocation, reference trials included; a configuration refused "
            "before it runs (it cannot run here) is recorded but not counted (default: the search stops on its "
            "own once no untried configuration is expected to gain more than the noise; at most "
            f"{DEFAULT_TRIAL_CAP} trials).",
            "int",
            minimum=1,
            maximum=MAX_TRIALS,
            worker=PARENT,
        ),
    )
    timeout_s: float | None = setting(
        None, Option("--timeout", "Stop starting new trials after this long, e.g. 10m.", "duration")
    )
    trial_timeout_s: float | None = setting(
        None,
        Option(
            "--trial-timeout",
            "Kill a trial after this long (default 300s on CPU, 600s on CUDA).",
            "duration",
            worker=PARENT,
        ),
    )
    recipe: str | None = setting(
        None, Option("--recipe", "Where to write the best recipe (default: recipes/<study>.json).")
    )
    warm_start_from: str | None = setting(
        None,
        Option(
            "--warm-start-from",
            "Start a new study with another study's best configurations (REF: .db path or URL#study).",
            worker=NEVER,
        ),
    )
    new_study: bool = setting(
        False,
        Option(
            "--new-study",
            "Start a new study even when one of this name exists (it is named NAME-2, NAME-3, ...). A resumed "
            "study keeps its memory limit, --global-batch-tokens, --steps and --min-time; to change them, start a "
            "new one.",
            "flag",
            worker=NEVER,
        ),
    )
    objective: str | None = setting(
        None,
        Option(
            "--objective",
            "What to maximize under the memory limit: effective tokens/s (default), or tokens per joule "
            "(needs an energy counter: NVML on a whole GPU, RAPL on a CPU); with --task generate, output tokens/s "
            "(default) or latency (the fastest request at batch 1). A resumed study keeps its own.",
            "choice",
            choices=("tokens_per_sec", "tokens_per_joule", "latency"),
        ),
    )
    # --- text generation (--task generate): the workload and its bounds ---------------------------
    task: str = setting(
        "train",
        Option(
            "--task",
            "train: the fastest training step; generate: the fastest text generation (prefill and a greedy "
            "decode loop) of the workload below.",
            "choice",
            choices=("train", "generate"),
            show_default=True,
            worker=NEVER,  # --devices runs training workers only
        ),
    )
    prompt_len: int | None = setting(
        None,
        Option(
            "--prompt-len",
            "generate: prompt length in tokens (default 32, unless --prompts).",
            "int",
            minimum=1,
            maximum=MAX_SEQ_LEN,
            metavar="N",
            worker=NEVER,  # --devices runs training workers only
        ),
    )
    prompts: str | None = setting(
        None,
        Option(
            "--prompts",
            "generate: a file of prompts whose token-length distribution is the workload (PATH.txt: one prompt a "
            'line; PATH.jsonl: {"prompt": ...} or {"text": ...} a line).',
            metavar="PATH",
            worker=NEVER,  # --devices runs training workers only
        ),
    )
    new_tokens: int | None = setting(
        None,
        Option(
            "--new-tokens",
            "generate: tokens generated for each prompt, always that many (default 32).",
            "int",
            minimum=1,
            maximum=MAX_NEW_TOKENS,
            metavar="M",
            worker=NEVER,  # --devices runs training workers only
        ),
    )
    batch: str | None = setting(
        None,
        Option(
            "--batch",
            "generate: batch sizes to search: 1-8 (powers of two in the range), 1,2,4 or 4 (fixed). Default 1,2,4 "
            "on a CPU, 1-64 on CUDA; --objective latency fixes 1.",
            metavar="SIZES",
            worker=NEVER,  # --devices runs training workers only
        ),
    )
    max_p99_token_latency_s: float | None = setting(
        None,
        Option(
            "--max-p99-token-latency",
            "generate: feasible only if the p99 time per output token is at most this, e.g. 40ms (an Optuna "
            "constraint).",
            "duration",
            worker=NEVER,  # --devices runs training workers only
        ),
    )
    max_ttft_s: float | None = setting(
        None,
        Option(
            "--max-ttft",
            "generate: feasible only if the p99 time to first token is at most this, e.g. 200ms (an Optuna "
            "constraint).",
            "duration",
            worker=NEVER,  # --devices runs training workers only
        ),
    )
    fix: str | None = setting(
        None,
        Option(
            "--fix",
            "Knobs held at a value, the others searched: e.g. amp_dtype=bfloat16,compile_mode=none (training; "
            "checkpoint_layers=none drops checkpointing) or decode_compile=none,dtype=float32 (--task generate).",
            metavar="KNOB=VALUE,...",
        ),
    )
    agree_tokens: int | None = setting(
        None,
        Option(
            "--agree-tokens",
            "generate: in float16/bfloat16, the greedy tokens must match the eager float32 reference on this many "
            "first tokens (default 8; float32 must match on every token).",
            "int",
            minimum=1,
            maximum=MAX_NEW_TOKENS,
            metavar="K",
            worker=NEVER,  # --devices runs training workers only
        ),
    )
    # Skip configurations the study's trials predict over the memory limit (search.memory_model).
    memory_model: bool = setting(
        True,
        Option(
            "--no-memory-model",
            "Run every configuration, even one the study's trials predict over the memory limit.",
            "off",
        ),
    )
    # A new study opens with the baseline and checklist trials (search.references): the
    # speedups the summary and the recipe report are over them.
    references: bool = setting(
        True,
        Option(
            "--no-references",
            "Do not open a new study with the baseline and checklist trials (the checklist compiles: tens of "
            "seconds on a CPU). The summary and the recipe then report no speedup over them.",
            "off",
            worker=NEVER,
        ),
    )
    # Re-measure the leaders before the best becomes a recipe (search.confirm); off, the recipe
    # is the best single run, as of a search stopped before its confirmation.
    confirm: bool = setting(
        True,
        Option(
            "--no-confirm",
            "Do not re-measure the leaders at the end (3 fresh runs, more where they run close): the recipe is "
            "then the best single run, which noise may have favoured. For quick looks.",
            "off",
        ),
    )
    worker: bool = setting(
        False, Option("--worker", "One of the --devices workers.", "flag", hidden=True, worker=PARENT)
    )

    @property
    def trial_cap(self) -> int:
        """The most trials this invocation runs: --n-trials, else a cap that the planner's own stop
        rule reaches first in every benchmark (benchmarks/README.md), kept as a safety net."""
        return self.n_trials if self.n_trials is not None else DEFAULT_TRIAL_CAP

    @property
    def limit_given(self) -> bool:
        return self.memory_limit_bytes is not None or self.memory_fraction is not None

    @classmethod
    def options(cls) -> list[tuple[str, Option, Any]]:
        """(field, option, default) of every setting, in declaration order."""
        return [(f.name, f.metadata["option"], f.default) for f in dataclasses.fields(cls)]

    @classmethod
    def from_options(cls, values: Mapping[str, Any]) -> "SearchSettings":
        """Settings from the parsed options (click's values, by field name)."""
        return cls(**{name: values[name] for name, _, _ in cls.options() if name in values})


def worker_argv(settings: SearchSettings) -> list[str]:
    """The options a `--devices` worker is given as they are: every `worker="pass"` setting the
    parent was given (each one at its default is left out, and takes the same default there)."""
    argv: list[str] = []
    for name, option, default in SearchSettings.options():
        value = getattr(settings, name)
        if option.worker == PASS and value != default:
            argv += option.argv(value)
    return argv
