"""Shared test set-up: one intra-op thread per process, the repository root on sys.path (a
user-style model factory `tests.fixture_models:make_llama` imports the way `autotune bench
--model ...` imports one), the spies on measure()'s data path, and the fixtures that cost a
search, a script or a server, each made once for the whole session and shared by the modules
that read it:

    gpu_check_run        benchmarks/gpu_check.sh run to its end (a dry run without a GPU)
    searched             `autotune search` through the CLI: two references, two sampled trials
    compare_studies      a copy of it as study "a", and "b" warm-started from it
    journal_two_workers  two `autotune search` processes on one journal file
    postgres_two_workers the same on a real PostgreSQL server
    recipe               gpt2-tiny measured once here, as a recipe
    postgres             the server: AUTOTUNE_TEST_POSTGRES_URL, else a throwaway one

PostgreSQL: AUTOTUNE_TEST_POSTGRES_URL (.ci/postgres.sh exports it), else a throwaway server
started here from /usr/lib/postgresql/*/bin (as the postgres user when run as root), with
password authentication. Skipped only when neither works and CI is not set; in CI, a failure."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

# One intra-op thread in this process and in every process the tests start (trials, tuners,
# scripts inherit it): gpt2-tiny's small matmuls gain nothing from a second thread, and where
# the cores are shared, OpenMP threads waiting on each other make a step several times slower.
# Set before torch is imported. No test is about threads.
os.environ["OMP_NUM_THREADS"] = "1"
# The same for inductor's code generation: no pool of compile workers, started (seconds) in
# every process that compiles, to share two cores already busy with the tests' own processes.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
# Bytecode cached, as Python does by default, even where PYTHONDONTWRITEBYTECODE is set (this
# machine sets it): otherwise each xdist worker rewrites and compiles all the test modules
# again at every run (~4 s of the fast tier's start on a fresh clone), and every tuner, fork
# server and CLI process the tests start compiles autotune from source. __pycache__ is ignored
# by git; the writes are atomic (a rename), so concurrent workers share them safely.
sys.dont_write_bytecode = False
# Ctrl-C reaches every process the tests start, as it does a user's: a suite started in the
# background (nohup, `&` in a script without job control) inherits SIGINT ignored, and so would
# every search, trial and worker it starts (exec keeps an ignored signal ignored; a handled one
# goes back to its default), and each Ctrl-C test would fail on a signal never delivered.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# The same for SIGHUP under `nohup`: a search started with SIGHUP ignored keeps it ignored, as
# nohup asks (trial/processes.py), so the test that hangs a search up would wait for it forever.
if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# Property-based tests draw the same examples on every run (Hypothesis's derandomize): a pass in
# CI is not luck, and a failure reproduces. HYPOTHESIS_PROFILE=explore draws new random examples,
# five times as many, to look for bugs; what it finds becomes an @example.
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("ci", derandomize=True, database=None, print_blob=True, max_examples=30)
_hypothesis_settings.register_profile("explore", derandomize=False, database=None, max_examples=500)
_hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _temp_files_in_memory(min_free: int = 4 << 30) -> None:
    """Temporary files (every tmp_path: the tests' SQLite studies, journals, recipes; the
    trials' files) on /dev/shm when it has room, unless TMPDIR says where. SQLite syncs each
    commit to disk, 4-5 ms apiece on this machine's disk and thousands of them a session; no
    test is about the disk. Inductor's cache stays where torch keeps it by default (warm)."""
    shm = "/dev/shm"
    if "TMPDIR" in os.environ or not os.path.isdir(shm) or not os.access(shm, os.W_OK | os.X_OK):
        return
    stat = os.statvfs(shm)
    if stat.f_bavail * stat.f_frsize < min_free:
        return
    import getpass
    import tempfile

    inductor_cache = os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")  # torch's default
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", inductor_cache)
    os.environ["TMPDIR"] = shm  # inherited by every process the tests start
    tempfile.tempdir = None  # this process's cached choice: made again from TMPDIR


_temp_files_in_memory()

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
# The processes the tests start (trials, tuners, scripts, probes run from a temporary folder)
# import this checkout's autotune too, whichever one pip installed (a worktree, a clean clone).
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

import contextlib  # noqa: E402
import gc  # noqa: E402
import glob  # noqa: E402
import pwd  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import uuid  # noqa: E402
from concurrent.futures import Future, ThreadPoolExecutor  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any, Callable, NamedTuple  # noqa: E402

import optuna  # noqa: E402
import pytest  # noqa: E402

from tests.helpers import (  # noqa: E402
    A100,
    COMPARE_SPACE,
    FAST,
    SEARCHED_SEED,
    STUDY,
    TINY_SPACE,
    BatchRecord,
    Ran,
    TwoWorkers,
    autotune_cmd,
    finish,
    in_repo_env,
    record_batches,
    recording_imports,
    run_two_workers,
    start_process,
    tiny_spec,
)

# --- measure()'s data path, data, compile caches, the working directory --------------------------------


@pytest.fixture
def batch_record(monkeypatch) -> BatchRecord:
    """Spy on `measure()`'s data path: which loader it built and the batches it stepped on."""
    return record_batches(monkeypatch)


@pytest.fixture(scope="session")
def synthetic():
    """A synthetic corpus, small but with the real length distribution: ~5,000 documents."""
    from autotune.data.datasets import make_dataset

    return make_dataset("synthetic", vocab_size=320, seq_len=128, seed=0, min_tokens=128 * 2048)


@pytest.fixture
def fresh_dynamo():
    """Compile tests start and end with dynamo's caches and counters cleared, so graph
    counts belong to the test and no compiled code leaks into the next test."""
    import torch._dynamo

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def aot_eager(monkeypatch):
    """torch.compile through dynamo and AOTAutograd (graphs, guards, recompiles, the joint
    forward/backward with its checkpoints) without inductor's code generation, a C++ compile
    per graph that costs tens of seconds on these CPUs. For tests about what dynamo traces and
    how often; a test about generated kernels compiles for real."""
    import torch

    real_compile, real_module_compile = torch.compile, torch.nn.Module.compile

    def compile_(model=None, *, mode=None, backend="inductor", options=None, **kwargs):
        if model is None:  # used as a decorator factory
            return lambda fn: real_compile(fn, backend="aot_eager", **kwargs)
        return real_compile(model, backend="aot_eager", **kwargs)

    def module_compile(self, *args, mode=None, backend="inductor", options=None, **kwargs):
        return real_module_compile(self, *args, backend="aot_eager", **kwargs)

    monkeypatch.setattr(torch, "compile", compile_)
    monkeypatch.setattr(torch.nn.Module, "compile", module_compile)


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """The test's tmp dir as the working directory; trial processes can import tests.*."""
    monkeypatch.chdir(tmp_path)
    in_repo_env(monkeypatch)
    return tmp_path


# --- heavy fixtures, made in the background ----------------------------------------------------------
#
# The searches (and the GPU check's dry run) that several tests read are processes: they are made
# on a background thread from the start of the session, one after another, in the order the
# tests need them, while the tests that need none of them run first (pytest_collection_modifyitems
# below). Only those the selected tests use are made: the fast tier makes none.

PREFETCHED = ("gpu_check_run", "searched", "compare_studies", "journal_two_workers", "postgres_two_workers")
# Under pytest-xdist (the project's default: -n auto in pyproject.toml), the tests reading one of
# these share one worker, which makes it once: a group (`--dist loadgroup`) per fixture it needs.
XDIST_GROUPS = {"compare_studies": "searched"}  # compare_studies is made from searched


def _prefetched_group(item) -> str | None:
    used = [name for name in PREFETCHED if name in item.fixturenames]
    return XDIST_GROUPS.get(used[0], used[0]) if used else None


# Session fixtures of this file that measure something (seconds): their tests share a worker
# too, which makes them once.
SHARED_HERE = ("recipe",)


def _shared_group(item) -> str | None:
    """The worker a test shares with the others reading what it reads, besides the prefetched
    fixtures: the module (or class) whose module- or class-scoped fixture it uses (one launch,
    one model, one study made for all its tests, as tests/trial/test_parity.py's two ranks: split
    over two workers, each made it); else one of SHARED_HERE. None when it reads nothing shared."""
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs if info is not None else {}
    for name in item.fixturenames:
        fixture = defs[name][-1] if defs.get(name) else None
        if fixture is None or fixture.scope not in ("class", "module", "package"):
            continue
        if fixture.baseid.partition("::")[0].endswith(".py"):  # defined in a test module (or its class)
            return fixture.baseid.partition("::")[0]
    return next((name for name in SHARED_HERE if name in item.fixturenames), None)


def pytest_configure(config) -> None:
    """One garbage collection at the end of the session, not pytest's five: it collects to
    report exceptions raised in __del__ (an unraisable exception is reported when it happens;
    this only flushes the stragglers), and on these processes' heaps (~900,000 objects after
    the tests, torch and dynamo) each collection costs 0.3-0.7 s in every worker."""
    try:
        from _pytest.unraisableexception import gc_collect_iterations_key  # pytest's own knob
    except ImportError:  # another pytest: its default
        return
    config.stash[gc_collect_iterations_key] = 1


def pytest_collection_finish(session) -> None:
    """Freeze what imports and collection made (torch, dynamo, transformers, the test items:
    well over a million objects, alive until the end anyway): a full collection then walks
    only what the tests make, not all of it again each time."""
    gc.freeze()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config) -> None:
    """Freeze everything before the interpreter exits: its final collections would otherwise
    walk the whole heap, 2-5 s in every worker and the controller, to free memory the
    process is about to give back anyway."""
    gc.freeze()


def _in_xdist_worker(config) -> bool:
    return hasattr(config, "workerinput")


def pytest_runtest_setup(item) -> None:
    """Tests marked cuda_fakes run the CUDA paths on tests/cuda_fakes.py: where a real GPU is
    visible (the suite on the GPU machine), they are skipped, with the reason, and the GPU's own
    checks take their place."""
    if item.get_closest_marker("cuda_fakes") is not None:
        from tests.cuda_fakes import real_gpu_reason

        if (why := real_gpu_reason()) is not None:
            pytest.skip(why)


# Not in the fast tier (`-m "not slow"`): what starts processes, needs the database server or
# compiles for real is slow by its nature; `slow` alone marks a test that steps a real model or
# runs a whole search in the test process (one smoke test of each stays fast).
SLOW_BY_NATURE = ("process", "postgres", "compile")


# tryfirst: before xdist reads the groups into the node ids, and before `-m` deselects (the
# slow marks added here count)
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    """The slow marks, the xdist groups, and the order. In one process: tests that start no
    process first, then
    the other process tests, then those reading a prefetched fixture, made meanwhile in the
    background: by then it is ready, or nearly. Under xdist the other way round: the longest
    work first, so that no worker is left with it at the end while the other idles. Stable
    within each group."""

    def group(item) -> int:
        if _prefetched_group(item) is not None:
            return 3
        if item.get_closest_marker("compile"):
            return 2  # the longest single tests (tens of seconds of compiling)
        return 1 if any(item.get_closest_marker(m) for m in ("process", "postgres")) else 0

    for item in items:
        # A prefetched fixture's group first (the costliest to make twice); else a group given by
        # hand (pytestmark = pytest.mark.xdist_group(...)) stands.
        name = _prefetched_group(item)
        if name is None and item.get_closest_marker("xdist_group") is None:
            name = _shared_group(item)
        if name is not None:
            item.add_marker(pytest.mark.xdist_group(name))
        if any(item.get_closest_marker(m) for m in SLOW_BY_NATURE):
            item.add_marker(pytest.mark.slow)
    items.sort(key=group, reverse=_in_xdist_worker(config))


class Background:
    """Runs jobs one at a time on a thread; their processes are killed if the session ends first."""

    def __init__(self) -> None:
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fixtures")
        self.jobs: dict[str, Future] = {}
        self.procs: list[subprocess.Popen] = []
        self.lock = threading.Lock()
        self.closed = False

    def start(self, *args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
        """`python -m autotune ARGS`, started as start_tuner starts it."""
        return self.popen(autotune_cmd(*args), cwd=cwd, env=env)

    def popen(self, cmd: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
        """`cmd` started as start_process starts it, and killed with its group at close()."""
        with self.lock:
            if self.closed:
                raise RuntimeError("the test session is over")
            proc = start_process(cmd, cwd=cwd, env=env)
            self.procs.append(proc)
        return proc

    def submit(self, name: str, job: Callable[[], Any]) -> None:
        self.jobs[name] = self.executor.submit(job)

    def result(self, name: str, request, tmp_path_factory) -> Any:
        """Fixture `name`: from the background when it was submitted there, else made now, once
        (compare_studies reads searched in its job, the searched tests through their fixture)."""
        if name not in self.jobs:
            made: Future = Future()
            self.jobs[name] = made
            try:
                made.set_result(_JOBS[name](self, request, tmp_path_factory)())
            except BaseException as exc:
                made.set_exception(exc)
        return self.jobs[name].result()

    def close(self) -> None:
        with self.lock:
            self.closed = True
        for job in self.jobs.values():
            job.cancel()
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        self.executor.shutdown(wait=True)


@pytest.fixture(scope="session", autouse=True)
def background(request, tmp_path_factory) -> Background:
    bg = Background()
    # An xdist worker runs the tests the scheduler hands it, not all it collected: it makes a
    # fixture when a test first asks (the other worker keeps the second core busy meanwhile).
    items = [] if _in_xdist_worker(request.config) else request.session.items
    needed = set().union(*(item.fixturenames for item in items))
    for name in PREFETCHED:
        if name not in needed:
            continue
        if name == "postgres_two_workers":
            try:
                request.getfixturevalue("postgres")
            except (pytest.skip.Exception, pytest.fail.Exception):
                continue  # no server: its tests skip (or fail, in CI) when they ask for it
        bg.submit(name, _JOBS[name](bg, request, tmp_path_factory))
    yield bg
    bg.close()


class Searched(NamedTuple):
    where: Path  # the working directory: studies/gpt2-tiny-cpu.db and recipes/gpt2-tiny-cpu.json
    result: Ran
    imports: Path  # what its processes imported (helpers.recorded_imports)


def _searched(bg: Background, request, tmp_path_factory) -> Callable[[], Searched]:
    where = tmp_path_factory.mktemp("search")
    imports = tmp_path_factory.mktemp("search-imports")

    def job() -> Searched:
        args = ["--model", "gpt2-tiny", *FAST, "--n-trials", "4", "--space", str(TINY_SPACE)]
        env = recording_imports(imports)
        proc = bg.start("search", *args, "--seed", str(SEARCHED_SEED), cwd=where, env=env)
        return Searched(where, Ran.of(finish(proc)), imports)

    return job


@pytest.fixture(scope="session")
def searched(background, request, tmp_path_factory) -> Searched:
    """`autotune search` run once through the CLI with 4 trials (the two references + two
    sampled, seeded: see SEARCHED_SEED) in a working directory of its own. Tests read it; one
    that adds trials works on a copy."""
    return background.result("searched", request, tmp_path_factory)


@dataclass
class CompareStudies:
    dir: Path  # a.db, b.db, both.db
    warm_expected: list[tuple[int, dict]]  # (trial number in a, config) b was warm-started with, best first


def _compare_studies(bg: Background, request, tmp_path_factory) -> Callable[[], CompareStudies]:
    tmp = tmp_path_factory.mktemp("studies")

    def job() -> CompareStudies:
        from autotune.search.warm_start import warm_start_candidates
        from autotune.study.storage import load_ref

        searched = bg.result("searched", request, tmp_path_factory)
        optuna.copy_study(
            from_study_name=STUDY,
            from_storage=f"sqlite:///{searched.where}/studies/{STUDY}.db",
            to_storage=f"sqlite:///{tmp}/a.db",
            to_study_name="a",
        )
        warm = [(t.number, t.config) for t in warm_start_candidates(load_ref(str(tmp / "a.db")), 5)]
        args = ["--model", "gpt2-tiny", *FAST, "--space", str(COMPARE_SPACE), "--n-trials", "3", "--seed", "1"]
        args.append("--no-confirm")  # its best as run: `searched` has the confirmation's tests
        where = ["--storage", f"sqlite:///{tmp}/b.db", "--study", "b", "--recipe", str(tmp / "recipes" / "b.json")]
        done = finish(bg.start("search", *args, "--warm-start-from", str(tmp / "a.db"), *where, cwd=tmp))
        assert done.returncode == 0, done.stderr[-3000:]
        optuna.load_study(study_name="b", storage=f"sqlite:///{tmp}/b.db").set_user_attr("hardware", A100)
        for name in ("a", "b"):
            optuna.copy_study(
                from_study_name=name, from_storage=f"sqlite:///{tmp}/{name}.db", to_storage=f"sqlite:///{tmp}/both.db"
            )
        return CompareStudies(tmp, warm)

    return job


@pytest.fixture(scope="session")
def compare_studies(background, searched, request, tmp_path_factory) -> CompareStudies:
    """a.db: study "a", a copy of `searched` (CPU, 4 trials on tests/spaces/tiny.yaml); b.db:
    study "b" on tests/spaces/compare.yaml, warm-started from a (3 trials: its references,
    then a's best searched configuration; a's next best wait in its queue), then relabelled
    as an A100's; both.db: copies of the two, for the #study syntax."""
    return background.result("compare_studies", request, tmp_path_factory)


@pytest.fixture
def studies(compare_studies) -> Path:
    """Where compare_studies keeps a.db, b.db and both.db."""
    return compare_studies.dir


def _journal_two_workers(bg: Background, request, tmp_path_factory) -> Callable[[], TwoWorkers]:
    cwd = tmp_path_factory.mktemp("journal-workers")
    return lambda: run_two_workers(f"journal:{cwd / 'study.journal'}", cwd, start=bg.start)


@pytest.fixture(scope="session")
def journal_two_workers(background, request, tmp_path_factory) -> TwoWorkers:
    return background.result("journal_two_workers", request, tmp_path_factory)


def _postgres_two_workers(bg: Background, request, tmp_path_factory) -> Callable[[], TwoWorkers]:
    cwd = tmp_path_factory.mktemp("pg-workers")
    # The URL carries a password and is given on the command line, with -v: the password
    # test checks it never comes back out.
    url = request.getfixturevalue("postgres").password_url()
    return lambda: run_two_workers(url, cwd, "-v", start=bg.start)


@pytest.fixture(scope="session")
def postgres_two_workers(background, postgres, request, tmp_path_factory) -> TwoWorkers:
    return background.result("postgres_two_workers", request, tmp_path_factory)


def _gpu_check_run(bg: Background, request, tmp_path_factory) -> Callable[[], tuple[subprocess.CompletedProcess, Path]]:
    out = tmp_path_factory.mktemp("gpu-check")

    # As on the GPU machine: `python3`, dependencies installed offline from a wheelhouse (this
    # Python's, which .ci/run builds; in CI it must be there), into a target folder.
    wheels = ROOT / f".wheelhouse-cp{sys.version_info.major}{sys.version_info.minor}"
    if os.environ.get("CI") and not wheels.is_dir():
        raise RuntimeError(f"{wheels} is missing: .ci/run builds it (benchmarks/gpu_wheelhouse.py)")

    def job() -> tuple[subprocess.CompletedProcess, Path]:
        env = {**os.environ, "OUT": str(out), "PYTHON": "python3"}
        if wheels.is_dir():
            env.update(AUTOTUNE_WHEELS=str(wheels), AUTOTUNE_GPU_CHECK_INSTALL="always")
        return finish(bg.popen(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], cwd=ROOT, env=env)), out

    return job


@pytest.fixture(scope="session")
def gpu_check_run(background, request, tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """benchmarks/gpu_check.sh run to its end, and the directory of its results ($OUT)."""
    return background.result("gpu_check_run", request, tmp_path_factory)


_JOBS = {
    "gpu_check_run": _gpu_check_run,
    "searched": _searched,
    "compare_studies": _compare_studies,
    "journal_two_workers": _journal_two_workers,
    "postgres_two_workers": _postgres_two_workers,
}


@pytest.fixture(scope="session")
def recipe():
    """gpt2-tiny measured once on this CPU, made into a recipe as search would."""
    from autotune.config import TrainConfig
    from autotune.device import software_versions
    from autotune.measure.loop import measure
    from autotune.recipe.recipe import Recipe, now_iso, recipe_measured

    cfg = TrainConfig(token_budget=1024)
    m = measure(tiny_spec(steps=6), cfg)
    assert m.outcome == "ok", m.reason
    return Recipe(
        config=cfg,
        model={**m.model, "name": "gpt2-tiny"},
        data="synthetic",
        measured=recipe_measured(m, None),
        hardware=m.device,
        software=software_versions(),
        study={"name": "test", "trial": 0},
        created=now_iso(),
    )


# --- PostgreSQL ------------------------------------------------------------------------------------------


@dataclass
class Postgres:
    url: str  # an account that may create roles and databases
    has_password: bool
    stop: Callable[[], None] | None = None

    def password_url(self) -> str:
        """A URL with a password in it: the server's own account when it has one, else a role
        made here (a trust-authenticated server ignores the password; it is still in the URL)."""
        if self.has_password:
            return self.url
        import psycopg2

        role, password = f"pw_{uuid.uuid4().hex[:8]}", f"Sekr3t-{uuid.uuid4().hex[:10]}"
        conn = psycopg2.connect(self.url)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"CREATE ROLE {role} LOGIN PASSWORD %s", (password,))
            cur.execute(f"CREATE DATABASE {role} OWNER {role}")
        conn.close()
        return self._with(f"{role}:{password}", role)

    def fresh_database(self) -> str:
        import psycopg2

        name = f"fresh_{uuid.uuid4().hex[:8]}"
        conn = psycopg2.connect(self.url)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name}")
        conn.close()
        return self._with(None, name)

    def _with(self, credentials: str | None, database: str) -> str:
        head, _, tail = self.url.partition("://")
        userinfo, _, rest = tail.rpartition("@")
        hostpart = rest.split("/", 1)[0]
        return f"{head}://{credentials or userinfo}@{hostpart}/{database}"


def _pg_bin() -> Path | None:
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: [int(x) for x in p.split("/")[4].split(".") if x.isdigit()],
    )
    if found:
        return Path(found[-1]).parent
    which = shutil.which("initdb")
    return Path(which).parent if which else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_postgres() -> Postgres:
    """initdb + pg_ctl on a free port under /tmp, password authentication on TCP."""
    bindir = _pg_bin()
    if bindir is None:
        raise RuntimeError("no PostgreSQL server binaries (initdb) found")
    as_user: list[str] = []
    if os.geteuid() == 0:  # initdb refuses to run as root
        pwd.getpwnam("postgres")  # KeyError when there is no postgres user
        as_user = ["runuser", "-u", "postgres", "--"]
    base = Path(tempfile.mkdtemp(prefix="autotune-pg-"))
    password = f"pg-{uuid.uuid4().hex[:12]}"
    (base / "pw").write_text(password + "\n")
    if as_user:
        shutil.chown(base, "postgres")
        shutil.chown(base / "pw", "postgres")
    port = _free_port()

    def run(*cmd: str) -> None:
        subprocess.run([*as_user, *cmd], check=True, capture_output=True, text=True, timeout=120)

    try:
        run(
            str(bindir / "initdb"),
            "-D",
            str(base / "data"),
            "-U",
            "tuner",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            f"--pwfile={base / 'pw'}",
        )
        run(
            str(bindir / "pg_ctl"),
            "-D",
            str(base / "data"),
            "-w",
            "-l",
            str(base / "log"),
            "-o",
            f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c max_connections=200",
            "start",
        )
        run(str(bindir / "createdb"), "-h", str(base), "-p", str(port), "-U", "tuner", "autotune")
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(base, ignore_errors=True)
        raise RuntimeError(
            f"{Path(exc.cmd[len(as_user)]).name} failed: {(exc.stderr or exc.stdout).strip()[-300:]}"
        ) from None

    def stop() -> None:
        subprocess.run(
            [*as_user, str(bindir / "pg_ctl"), "-D", str(base / "data"), "-m", "immediate", "stop"],
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(base, ignore_errors=True)

    return Postgres(f"postgresql://tuner:{password}@127.0.0.1:{port}/autotune", True, stop)


@pytest.fixture(scope="session")
def postgres():
    url = os.environ.get("AUTOTUNE_TEST_POSTGRES_URL")
    if url:
        yield Postgres(url, has_password=":" in url.split("://", 1)[1].split("@", 1)[0] if "@" in url else False)
        return
    try:
        server = _start_postgres()
    except Exception as exc:  # noqa: BLE001 - any reason means "no server here"
        message = f"no PostgreSQL: AUTOTUNE_TEST_POSTGRES_URL is unset and a local server could not start ({exc})"
        if os.environ.get("CI"):
            pytest.fail(message + "; in CI the multi-worker tests must run (see .ci/postgres.sh)")
        pytest.skip(message)
    yield server
    server.stop()


@pytest.fixture
def one_rank_group():
    """A gloo process group of one rank in this process (an in-memory store, no port): what the
    DDP and FSDP2 wraps need to be built; destroyed after the test."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
