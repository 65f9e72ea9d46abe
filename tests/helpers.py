"""Helpers shared by the test modules: paths, the CLI in-process and as a process, the
settings every test search uses, process checks, polling, and a synthetic GPU study.

Every measurement here is timed for 0 s at least (`--min-time 0`, `min_time_s=0`): the step
count alone decides the window, except in the tests about the minimum time itself."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState, create_trial

from autotune.cli import main
from autotune.config import RunSpec, TrainConfig
from autotune.search.fleet import STORAGE_ENV
from autotune.search.run import SearchSettings
from autotune.study.storage import open_storage

ROOT = Path(__file__).resolve().parent.parent
SPACES = ROOT / "tests" / "spaces"
TINY_SPACE = SPACES / "tiny.yaml"
COMPARE_SPACE = SPACES / "compare.yaml"
GiB = 2**30

# Hugging Face's libraries cost ~1.5 s of CPU to import (transformers, accelerate): in every
# xdist worker that collects a module importing them at its top, though one worker runs those
# tests. Modules that use them are marked HF (one worker; skipped where one is missing, except
# in CI, where they must run: a failure there, as for PostgreSQL) and import them lazily
# (`transformers = lazy("transformers")`).
HF_PACKAGES = ("transformers", "accelerate")
HF = [
    pytest.mark.skipif(
        not os.environ.get("CI") and any(importlib.util.find_spec(name) is None for name in HF_PACKAGES),
        reason="needs transformers and accelerate (the test extra)",
    ),
    pytest.mark.xdist_group("integrations"),
]


class lazy:  # noqa: N801 (stands for a module)
    """A module imported on first attribute access."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str):
        if attr.startswith("__"):  # pytest's collection inspects every module-level name
            raise AttributeError(attr)
        return getattr(importlib.import_module(self._name), attr)


# The CLI's run options in every test that runs the model: gpt2-tiny-sized work on this CPU.
FAST = ["--device", "cpu", "--steps", "4", "--warmup", "1", "--min-time", "0"]
STUDY = "gpt2-tiny-cpu"  # the name `autotune search --model gpt2-tiny --device cpu` gives its study
# The seed of the session's `searched` study: its two sampled trials are then 2048 tokens with
# math attention and 1024 with flash, neither checkpointed (configurations TPE draws at random
# before it models the space, whatever the measurements): one runs on a Volta GPU, one does not.
SEARCHED_SEED = 14
TRIALS_PER_WORKER = 2  # in the two-worker runs (conftest.run_two_workers)
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)

# Trial params of tests/spaces/tiny.yaml: the smallest configuration.
TINY_PARAMS = {
    "token_budget": 1024,
    "amp_dtype": "float32",
    "compile_mode": "none",
    "sdpa_backend": "math",
    "num_workers": 0,
    "checkpoint_count": 0,
}

# Optuna's log handler is bound to the stderr of its first use: make that pytest's, not a
# CliRunner stream that is closed when the command returns.
optuna.logging.set_verbosity(optuna.logging.WARNING)


# --- the CLI ----------------------------------------------------------------------------------------


def invoke(*args: str, env: dict[str, str] | None = None):
    """`autotune ARGS` in this process, through click's runner."""
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def repo_env(**extra: str) -> dict[str, str]:
    """This environment for a child process that imports `tests.*` (fault models, user
    factories) from any working directory, without a storage URL inherited from a worker."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.pop(STORAGE_ENV, None)
    env.update(extra)
    return env


def in_repo_env(monkeypatch) -> None:
    """Trial processes started from this process can import tests.fault_models."""
    monkeypatch.setenv("PYTHONPATH", repo_env()["PYTHONPATH"])


def autotune_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "autotune", *args]


def run_autotune(
    *args: str, cwd: Path, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python -m autotune ARGS` as a process, to its end."""
    return subprocess.run(
        autotune_cmd(*args), cwd=cwd, env=env or repo_env(), capture_output=True, text=True, timeout=timeout
    )


def start_process(cmd: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`cmd` started in its own session (a signal reaches it alone, as a terminal's Ctrl-C
    would; its whole group can be killed), its output piped."""
    return subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env or repo_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def start_tuner(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`python -m autotune ARGS`, started as start_process starts a command."""
    return start_process(autotune_cmd(*args), cwd=cwd, env=env)


IMPORTS_RECORD_ENV = "AUTOTUNE_TEST_IMPORTS_RECORD"
_RECORDING_SITE = """import atexit, json, os, sys


def _record():
    with open(os.path.join(os.environ[%r], f"{os.getpid()}.json"), "w") as f:
        json.dump({"argv": sys.argv, "torch": "torch" in sys.modules}, f)


if os.environ.get(%r):
    atexit.register(_record)
""" % (IMPORTS_RECORD_ENV, IMPORTS_RECORD_ENV)


def with_site(where: Path, code: str, **extra: str) -> dict[str, str]:
    """repo_env(**extra) for Python processes that run `code` as they start: a sitecustomize in
    where/site (as cuda_fakes.child_env installs its fakes), to inject a fault from inside a
    process (its trials faked, its clock skewed)."""
    site = where / "site"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(code)
    env = repo_env(**extra)
    return {**env, "PYTHONPATH": os.pathsep.join([str(site), env["PYTHONPATH"]])}


def recording_imports(where: Path) -> dict[str, str]:
    """repo_env(), in which every Python process that exits normally writes
    where/<pid>.json: its argv and whether it imported torch. Forked trials end with os._exit:
    not recorded."""
    return with_site(where, _RECORDING_SITE, **{IMPORTS_RECORD_ENV: str(where)})


def recorded_imports(where: Path) -> list[dict]:
    """What the processes started with recording_imports(where) wrote."""
    return [json.loads(path.read_text()) for path in sorted(where.glob("*.json"))]


def finish(proc: subprocess.Popen, timeout: float = 600) -> subprocess.CompletedProcess:
    """Wait for a process started with pipes; what it printed and its exit status."""
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@dataclass
class Ran:
    """A finished command, read like click's test result: exit_code, stdout, stderr, output."""

    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    @classmethod
    def of(cls, done: subprocess.CompletedProcess) -> "Ran":
        return cls(done.returncode, done.stdout, done.stderr)


# --- what the test searches run ---------------------------------------------------------------------


def search_args(storage: str, study: str, n_trials: int, *extra: str) -> list[str]:
    """An `autotune search` command line on tests/spaces/tiny.yaml."""
    return [
        "search",
        "--model",
        "gpt2-tiny",
        *FAST,
        "--space",
        str(TINY_SPACE),
        "--trial-timeout",
        "240s",
        "--n-trials",
        str(n_trials),
        "--storage",
        storage,
        "--study",
        study,
        *extra,
    ]


def search_settings(**kwargs) -> SearchSettings:
    """`search` settings as a library call: gpt2-tiny on this CPU, tests/spaces/tiny.yaml."""
    base = dict(model="gpt2-tiny", device="cpu", space=str(TINY_SPACE), steps=4, warmup=1, min_time_s=0)
    return SearchSettings(**{**base, **kwargs})


def study_settings(tmp: Path, name: str, **kwargs) -> SearchSettings:
    """Settings of a study `name` kept in tmp/NAME.db on tests/spaces/compare.yaml, its
    recipe in tmp/recipes."""
    base = dict(
        space=str(COMPARE_SPACE),
        storage=f"sqlite:///{tmp}/{name}.db",
        study=name,
        recipe=str(tmp / "recipes" / f"{name}.json"),
    )
    return search_settings(**{**base, **kwargs})


# gpt2-tiny's context and blocks, and the data tests' token budget (the `synthetic` fixture is made
# for this context).
SEQ, N_LAYER, BUDGET = 128, 2, 4096


def write_space(tmp_path: Path, text: str, name: str = "space.yaml") -> Path:
    """A search space file of `text` (dedented) in tmp_path."""
    import textwrap

    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def bind_space(path: Path, n_layer: int | None = N_LAYER, seq_len: int | None = SEQ):
    """The search space at `path`, bound to a model's depth and context (gpt2-tiny's by default)."""
    from autotune.space.file import load_space

    return load_space(path, n_layer=n_layer, seq_len=seq_len)


def data_loader(dataset, **knobs):
    """build_dataloader over `dataset` at context SEQ, seed 0, token_budget BUDGET unless given."""
    from autotune.data.batching import build_dataloader

    knobs.setdefault("token_budget", BUDGET)
    return build_dataloader(dataset, TrainConfig(**knobs), seq_len=SEQ, seed=0)


def tiny_spec(**changes) -> RunSpec:
    """A measurement of gpt2-tiny on this CPU: one warm-up step, `steps` timed, no minimum time."""
    return RunSpec(**{"model": "gpt2-tiny", "device": "cpu", "warmup": 1, "steps": 5, "min_time_s": 0, **changes})


def tiny_context():
    """The training task of a gpt2-tiny study on tests/spaces/tiny.yaml."""
    from autotune.device import describe
    from autotune.search.training import TrainTask
    from autotune.space.file import load_space

    spec = RunSpec(model="gpt2-tiny", device="cpu", warmup=1, steps=4, min_time_s=0, memory_limit_bytes=2 * GiB)
    return TrainTask(
        spec=spec,
        device=describe("cpu"),
        space=load_space(TINY_SPACE, n_layer=2, seq_len=128),
        memory_limit_bytes=2 * GiB,
        trial_timeout_s=60,
    )


def meta_model(name: str):
    """A model built on the meta device: shapes only, no memory and no random init cost (gpt2-xl is 1.5B)."""
    import torch

    from autotune.model.load import build_model

    with torch.device("meta"):
        return build_model(name)


# The CPU attention kernels, as the profiler names them.
MATH_OP = "aten::_scaled_dot_product_attention_math"
FLASH_OP = "aten::_scaled_dot_product_flash_attention_for_cpu"


def tiny(seed: int = 0):
    """gpt2-tiny, seeded."""
    import torch

    from autotune.model.load import build_model

    torch.manual_seed(seed)
    return build_model("gpt2-tiny")


def batch(width: int = 48, rows: int = 2, seed: int = 1):
    """(input_ids, labels) for gpt2-tiny: random tokens, labels the inputs shifted by one."""
    import torch

    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 320, (rows, width), generator=g)
    return x, torch.roll(x, -1, dims=1)


def ok_measurement():
    """What a trial process reports for a run that went well, as the objective reads it."""
    from autotune.measure.measurement import Measurement

    return Measurement(config={}, outcome="ok", tokens_per_sec=5000.0, peak_memory_bytes=800)


def nothing_written(where: Path) -> bool:
    """No study and no recipe under `where`: what every refused command must leave."""
    return not (where / "studies").exists() and not (where / "recipes").exists()


def run_objective(ctx, params: list[dict], objective=None) -> optuna.Study:
    """The search's objective on chosen configurations, in an in-memory study without the
    reference trials: the trial path of `run_search` (Objective -> runner -> trial process),
    only the configurations are picked by the test."""
    from autotune.search.objective import Objective, TrialFailed

    study = optuna.create_study(direction="maximize")
    for p in params:
        study.enqueue_trial(p)
    study.optimize(objective or Objective(ctx), n_trials=len(params), catch=(TrialFailed,))
    return study


def run_together(n: int, work) -> list[Exception]:
    """Run `work` in n threads released at the same moment; return what they raised."""
    import threading

    barrier, errors = threading.Barrier(n), []

    def worker() -> None:
        try:
            barrier.wait()
            work()
        except Exception as exc:  # noqa: BLE001 - the test asserts there were none
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return errors


def cpu_recipe(**knobs):
    """A recipe of gpt2-tiny (context 64) made on this machine, with these knobs."""
    from autotune.device import describe, software_versions
    from autotune.recipe.recipe import Recipe

    model = knobs.pop("model", {"name": "gpt2-tiny", "seq_len": 64, "n_layer": 2, "vocab_size": 320})
    return Recipe(
        config=TrainConfig(**knobs),
        model=model,
        measured={"tokens_per_sec": 1234.5, "peak_memory_bytes": 10**8, "memory_limit_bytes": None},
        hardware=describe("cpu").to_dict(),
        software=software_versions(),
        study={"name": "s", "storage": "sqlite:///x.db", "trial": 3},
        created="2026-01-01T00:00:00+00:00",
    )


def save_recipe(recipe, path: Path, **measured) -> Path:
    """A copy of `recipe` saved at `path`, its measured figures updated with `measured`."""
    from autotune.recipe.recipe import Recipe

    copy = Recipe.from_dict(recipe.to_dict())
    copy.measured.update(measured)
    return copy.save(path)


def load(url: str, study: str) -> optuna.Study:
    return optuna.load_study(study_name=study, storage=open_storage(url, create=False))


def running_trial_with_pid(url: str, study: str) -> FrozenTrial | None:
    """A RUNNING trial whose process has started."""
    trials = load(url, study).get_trials(deepcopy=False)
    running = [t for t in trials if t.state == TrialState.RUNNING and t.user_attrs.get("trial_pid")]
    return running[0] if running else None


def hold_a_running_trial(url: str, study: str, tuner: subprocess.Popen) -> FrozenTrial:
    """A RUNNING trial whose process is stopped (SIGSTOP), so that it is still running when the
    test's signal lands: a gpt2-tiny trial lasts about a second, less than a loaded machine can
    take between seeing it run and signalling the tuner (CI once saw it finish first). On Ctrl-C
    the tuner kills it with SIGKILL, which a stopped process obeys; a test that kills the tuner
    instead sends SIGCONT, or the trial could never see its tuner die."""

    def held():
        assert tuner.poll() is None, tuner.communicate()[1][-3000:]
        trial = running_trial_with_pid(url, study)
        if trial is None:
            return None
        pid = trial.user_attrs["trial_pid"]
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            return None  # it ended first: hold the next one
        deadline = time.monotonic() + 5
        while (state := process_state(pid)) not in ("T", "Z", None) and time.monotonic() < deadline:
            time.sleep(0.01)
        return trial if state == "T" else None

    return wait_for(held, 180, "a running trial", poll=0.05)


# --- measure()'s data path -------------------------------------------------------------------------


class RecordingLoader:
    """Wraps the DataLoader that `measure()` builds and records every batch it yields, in
    order: the first `warmup_steps` are warm-up, the next `steps` the timed window (the shape
    warm-up's synthetic batches come from no loader: they are not recorded)."""

    def __init__(self, loader, record: "BatchRecord") -> None:
        self.loader = loader
        self.record = record

    def __iter__(self):
        for batch in self.loader:  # (input_ids, labels), and document_ids under a document mask
            input_ids, labels = batch[0], batch[1]
            self.record.shapes.append(tuple(input_ids.shape))
            self.record.tokens.append(int((labels != -100).sum()))
            yield batch

    def __len__(self) -> int:
        return len(self.loader)

    # What measure() reads of its loader besides the batches (`distinct_batch_shapes`, for the
    # shape warm-up): the spy must not change the run it watches.
    @property
    def batch_sampler(self):
        return self.loader.batch_sampler

    @property
    def collate_fn(self):
        return self.loader.collate_fn


class BatchRecord:
    def __init__(self) -> None:
        self.loaders: list = []  # the real DataLoaders measure() built
        self.shapes: list[tuple[int, int]] = []
        self.tokens: list[int] = []

    def clear(self) -> None:
        self.loaders.clear()
        self.shapes.clear()
        self.tokens.clear()


def record_batches(monkeypatch) -> BatchRecord:
    """Spy on `measure()`'s data path: which loader it built and the batches it stepped on."""
    import autotune.measure.setup

    record = BatchRecord()
    real = autotune.measure.setup.build_dataloader

    def spy(*args, **kwargs):
        loader = real(*args, **kwargs)
        record.loaders.append(loader)
        return RecordingLoader(loader, record)

    monkeypatch.setattr(autotune.measure.setup, "build_dataloader", spy)
    return record


# --- processes ----------------------------------------------------------------------------------------


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, process group) from /proc, or None when there is no such process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[2])


def process_state(pid: int) -> str | None:
    """The state letter of /proc/PID/stat (R, S, T stopped, Z zombie...), None when gone."""
    stat = _proc_stat(pid)
    return stat[0] if stat else None


def pid_alive(pid: int) -> bool:
    """Running: not gone, not a zombie (dead, just not reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(TypeError):
        return _proc_stat(pid)[0] != "Z"
    return False


def parent_of(pid: int) -> int | None:
    """The parent pid of a process, from /proc; None when there is no such process."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def group_alive(pgid: int) -> list[int]:
    """Processes of process group `pgid` that still run."""
    alive = []
    for entry in os.listdir("/proc"):
        stat = _proc_stat(int(entry)) if entry.isdigit() else None
        if stat is not None and stat[1] == pgid and stat[0] != "Z":
            alive.append(int(entry))
    return alive


@contextlib.contextmanager
def killed_if_left(*pids: int):
    """Whatever the block asserts, the processes `pids` (and the groups they lead) are killed
    when it ends: a test that finds them alive fails without leaving them running."""
    try:
        yield
    finally:
        for pid in pids:
            for kill in (os.killpg, os.kill):
                with contextlib.suppress(OSError):
                    kill(pid, signal.SIGKILL)


def wait_for(predicate, timeout: float, what: str, poll: float = 0.25):
    """The predicate's first truthy value within `timeout` seconds, else an AssertionError."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class _RunnerClock:
    """The `time` module as the trial runner sees it: a day ahead once `ready()` holds."""

    def __init__(self, ready) -> None:
        self._ready = ready

    def monotonic(self) -> float:
        return time.monotonic() + (86_400.0 if self._ready() else 0.0)

    def __getattr__(self, name: str):
        return getattr(time, name)


def timeout_passes_once(monkeypatch, ready) -> None:
    """The trial runner's deadline passes as soon as `ready()` holds (the trial has started the
    child the test is about, say), not after real seconds of a timeout sized for the slowest
    start on a loaded machine: what happens at the timeout is tested the moment there is
    something to kill, on any load, with no idle wait. The runner reads this clock for its
    deadline only; the verdict names the configured timeout. A real timeout firing is tested
    where nothing needs to start first (test_preflight's hanging factory)."""
    import autotune.trial.runner

    monkeypatch.setattr(autotune.trial.runner, "time", _RunnerClock(ready))


@dataclass
class TwoWorkers:
    url: str
    study: str
    results: list[subprocess.CompletedProcess]
    cwd: Path
    wall_s: float


def run_two_workers(url: str, cwd: Path, *extra: str, start=start_tuner, env: dict | None = None) -> TwoWorkers:
    """Two `autotune search` processes started together on one new study, TRIALS_PER_WORKER each."""
    study = f"two-{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    # --no-confirm: each tuner would re-measure the leaders at its end, the compiled checklist
    # among them (tens of seconds on this CPU); these runs are about sharing one study.
    args = search_args(url, study, TRIALS_PER_WORKER, "--no-confirm")
    procs = [start(*extra, *args, cwd=cwd, env=env) for _ in range(2)]
    results = [finish(proc) for proc in procs]
    return TwoWorkers(url, study, results, cwd, time.monotonic() - started)


def assert_accounted(study: optuna.Study, expected: int) -> list:
    """Exactly `expected` trials, all finished, numbered 0..expected-1 once each, the two
    reference trials once each."""
    trials = study.get_trials(deepcopy=False)
    numbers = sorted(t.number for t in trials)
    states = {t.number: t.state.name for t in trials}
    assert numbers == list(range(expected)), f"trial numbers {numbers} (states {states})"
    assert all(t.state in FINISHED for t in trials), f"unfinished trials: {states}"
    references = sorted(t.user_attrs.get("reference") for t in trials if t.user_attrs.get("reference"))
    assert references == ["baseline", "checklist"], f"reference trials: {references}"
    return trials


# --- a synthetic GPU study: every outcome, without running a model -------------------------------------

A100 = {
    "kind": "cuda",
    "name": "NVIDIA A100-SXM4-80GB",
    "uuid": "GPU-0000",
    "index": 0,
    "total_memory_bytes": 85_899_345_920,
    "compute_capability": "8.0",
    "driver": "550.54",
    "cuda": "12.4",
    "torch": "2.13.0+cu124",
    "cpu_count": 32,
}

DISTS = {
    "token_budget": CategoricalDistribution([8192, 16384, 32768]),
    "amp_dtype": CategoricalDistribution(["float32", "bfloat16"]),
    "sdpa_backend": CategoricalDistribution(["math", "flash"]),
    "checkpoint_count": IntDistribution(0, 12),
}


def synthetic_study(storage: str, name: str = "gpt2-nvidia-h200", n: int = 24, limit: int = 40 * GiB) -> optuna.Study:
    """gpt2 on an H200 as a search would record it, made up: over the limit, out of memory,
    unsupported, then random configurations (seeded)."""
    rnd = random.Random(0)
    study = optuna.create_study(study_name=name, storage=storage, direction="maximize")
    hardware = {**A100, "name": "NVIDIA H200", "total_memory_bytes": 150_000_000_000, "compute_capability": "9.0"}
    for key, value in {
        "hardware": hardware,
        "model": "gpt2",
        "seq_len": 1024,
        "n_layer": 12,
        "data": "synthetic",
        "memory_limit_bytes": limit,
    }.items():
        study.set_user_attr(key, value)
    every_outcome = [  # over the limit, out of memory, unsupported; then random ones
        {"token_budget": 32768, "amp_dtype": "float32", "sdpa_backend": "math", "checkpoint_count": 3},
        {"token_budget": 32768, "amp_dtype": "float32", "sdpa_backend": "math", "checkpoint_count": 0},
        {"token_budget": 8192, "amp_dtype": "float32", "sdpa_backend": "flash", "checkpoint_count": 0},
    ]
    for number in range(n):
        p = (
            every_outcome[number]
            if number < len(every_outcome)
            else {
                k: (rnd.choice(d.choices) if isinstance(d, CategoricalDistribution) else rnd.randint(d.low, d.high))
                for k, d in DISTS.items()
            }
        )
        cfg = TrainConfig(
            token_budget=p["token_budget"],
            amp_dtype=p["amp_dtype"],
            sdpa_backend=p["sdpa_backend"],
            checkpoint_layers=tuple(range(p["checkpoint_count"])),
        ).to_dict()
        bf16 = cfg["amp_dtype"] == "bfloat16"
        rate = 20000 * (2.2 if bf16 else 1) * (1.3 if cfg["sdpa_backend"] == "flash" else 1) * rnd.uniform(0.9, 1.1)
        peak = int(cfg["token_budget"] / 1024 * (1.0 if bf16 else 2.0) * (1 - 0.05 * p["checkpoint_count"]) * GiB)
        attrs = {"config": cfg}
        common = dict(params=p, distributions=DISTS, user_attrs=attrs)
        if cfg["sdpa_backend"] == "flash" and not bf16:
            attrs.update(outcome="unsupported", reason="sdpa_backend: flash attention needs float16 or bfloat16")
            study.add_trial(create_trial(state=TrialState.PRUNED, **common))
        elif peak > 1.5 * limit:
            attrs.update(outcome="oom", reason="out of memory")
            study.add_trial(create_trial(value=0.0, constraints={"memory": 1.0}, **common))
        else:
            m = {"tokens_per_sec": rate, "peak_memory_bytes": peak, "peak_memory_source": "nvml", "mfu": 0.3}
            attrs.update(
                outcome="ok" if peak <= limit else "over_memory_limit",
                measurement=m,
                tokens_per_sec=rate,
                peak_memory_bytes=peak,
            )
            study.add_trial(create_trial(value=rate, constraints={"memory": (peak - limit) / limit}, **common))
    return study


# A tuned GPU recipe's configuration: every knob away from its default, blocks checkpointed.
# (Padded batches: no CUDA graphs, which record one graph per batch shape.)
TUNED = dict(
    num_workers=4,
    prefetch_factor=2,
    pin_memory=True,
    persistent_workers=True,
    token_budget=16384,
    amp_dtype="bfloat16",
    compile_mode="max-autotune-no-cudagraphs",
    sdpa_backend="flash",
    checkpoint_layers=(0, 1, 5),
)


class SignalWhileLocked:
    """Stands in for `Popen._waitpid_lock`: while the lock is held, SIGINT arrives once (across
    all instances until `reset`), as a Ctrl-C that lands inside `Popen.poll()` does. Seen once
    in CI: the fleet supervisor then polled that worker forever."""

    fired = False

    def __init__(self) -> None:
        self._lock = threading.Lock()

    @classmethod
    def reset(cls) -> None:
        cls.fired = False

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        taken = self._lock.acquire(blocking, timeout)
        if taken and not SignalWhileLocked.fired:
            SignalWhileLocked.fired = True
            signal.raise_signal(signal.SIGINT)
        return taken

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> bool:  # Popen.wait() takes it with `with`
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextlib.contextmanager
def give_up_after(seconds: int, what: str):
    """A TimeoutError naming `what` if the block still runs after `seconds` (SIGALRM: the block
    may be stuck in a blocking call that no other timeout reaches)."""

    def give_up(signum, frame):
        raise TimeoutError(what)

    previous = signal.signal(signal.SIGALRM, give_up)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
