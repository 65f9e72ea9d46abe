"""The fault matrix of docs/reliability.md, row by row, on a CPU-only machine.

Real processes where the fault is about processes: two concurrent `autotune search` workers
on a journal file and on a real PostgreSQL server, SIGINT and SIGKILL sent to a real tuner,
a killed worker's heartbeat going stale. Unit-level where the fault is about a decision.

PostgreSQL: AUTOTUNE_TEST_POSTGRES_URL (.ci/postgres.sh exports it), else a throwaway server
started here from /usr/lib/postgresql/*/bin (as the postgres user when run as root), with
password authentication. Skipped only when neither works and CI is not set; in CI, a failure.

Trials use gpt2-tiny on tests/spaces/tiny.yaml with --steps 4 --warmup 1 (seconds each); the
"checklist" reference trial compiles (tens of seconds the first time on a cold inductor cache).
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import optuna
import pytest
from click.testing import CliRunner
from optuna.trial import TrialState

import autotune.device
import autotune.device.nvml
import autotune.measure.loop
import autotune.search.fleet
import autotune.search.objective
import autotune.search.run
import autotune.search.study
from autotune.cli import main
from autotune.measure import outcomes
from autotune.search.fleet import (STORAGE_ENV, WorkerDevice, parse_devices, plan_workers, resolve_devices,
                                   split_trials, worker_command)
from autotune.search.storage import RetryStaleTrial, default_grace_period_s, open_storage, redact

ROOT = Path(__file__).resolve().parent.parent
TINY_SPACE = ROOT / "tests" / "spaces" / "tiny.yaml"
M = 3  # trials per worker in the two-worker tests
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


# --- helpers ------------------------------------------------------------------------------------


def env_with_repo(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.pop(STORAGE_ENV, None)
    env.update(extra)
    return env


def search_args(storage: str, study: str, n_trials: int, *extra: str) -> list[str]:
    return ["search", "--model", "gpt2-tiny", "--device", "cpu", "--space", str(TINY_SPACE), "--steps", "4",
            "--warmup", "1", "--trial-timeout", "240s", "--n-trials", str(n_trials), "--storage", storage,
            "--study", study, *extra]


def autotune_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "autotune", *args]


def run_autotune(*args: str, cwd: Path, timeout: float = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(autotune_cmd(*args), cwd=cwd, env=env or env_with_repo(), capture_output=True, text=True,
                          timeout=timeout)


def start_tuner(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    # Its own session: the test signals the tuner alone, as a terminal's Ctrl-C would reach it.
    return subprocess.Popen(autotune_cmd(*args), cwd=cwd, env=env or env_with_repo(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def load(url: str, study: str) -> optuna.Study:
    return optuna.load_study(study_name=study, storage=open_storage(url, create=False))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):  # a zombie is dead for our purposes
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def wait_for(predicate, timeout: float, what: str, poll: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def running_trial_with_pid(url: str, study: str):
    """A RUNNING trial whose process has started."""
    trials = load(url, study).get_trials(deepcopy=False)
    running = [t for t in trials if t.state == TrialState.RUNNING and t.user_attrs.get("trial_pid")]
    return running[0] if running else None


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


# --- PostgreSQL -----------------------------------------------------------------------------------


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
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: [int(x) for x in p.split("/")[4].split(".") if x.isdigit()])
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
        run(str(bindir / "initdb"), "-D", str(base / "data"), "-U", "tuner", "--auth-local=trust",
            "--auth-host=scram-sha-256", f"--pwfile={base / 'pw'}")
        run(str(bindir / "pg_ctl"), "-D", str(base / "data"), "-w", "-l", str(base / "log"), "-o",
            f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c max_connections=200", "start")
        run(str(bindir / "createdb"), "-h", str(base), "-p", str(port), "-U", "tuner", "autotune")
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(base, ignore_errors=True)
        raise RuntimeError(f"{Path(exc.cmd[len(as_user)]).name} failed: {(exc.stderr or exc.stdout).strip()[-300:]}") from None

    def stop() -> None:
        subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(base / "data"), "-m", "immediate", "stop"],
                       capture_output=True, timeout=60)
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


def test_postgres_fixture_reaches_a_real_server(postgres):
    import psycopg2

    conn = psycopg2.connect(postgres.url)
    with conn.cursor() as cur:
        cur.execute("SELECT version()")
        assert "PostgreSQL" in cur.fetchone()[0]
    conn.close()


# --- row 6: several workers on one study ----------------------------------------------------------


@dataclass
class TwoWorkers:
    url: str
    study: str
    results: list[subprocess.CompletedProcess]
    cwd: Path
    wall_s: float


def run_two_workers(url: str, cwd: Path, *extra: str, env: dict[str, str] | None = None) -> TwoWorkers:
    study = f"two-{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    procs = [start_tuner(*extra, *search_args(url, study, M), cwd=cwd, env=env) for _ in range(2)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return TwoWorkers(url, study, results, cwd, time.monotonic() - started)


def check_two_workers(run: TwoWorkers) -> None:
    for r in run.results:
        assert r.returncode == 0, r.stderr[-3000:]
    trials = assert_accounted(load(run.url, run.study), 2 * M)
    assert len({t.user_attrs.get("tuner_pid") for t in trials}) == 2, "both workers ran trials"
    print(f"\n{redact(run.url).split(':', 1)[0]}: 2 workers x {M} trials -> {len(trials)} finished trials, "
          f"numbers 0..{len(trials) - 1} once each, references once, in {run.wall_s:.0f} s")


@pytest.fixture(scope="module")
def journal_two_workers(tmp_path_factory) -> TwoWorkers:
    cwd = tmp_path_factory.mktemp("journal-workers")
    return run_two_workers(f"journal:{cwd / 'study.journal'}", cwd)


@pytest.fixture(scope="module")
def postgres_two_workers(postgres, tmp_path_factory) -> TwoWorkers:
    cwd = tmp_path_factory.mktemp("pg-workers")
    # The URL carries a password and is given on the command line, with -v: row 11 checks it
    # never comes back out.
    return run_two_workers(postgres.password_url(), cwd, "-v")


def test_two_workers_on_a_journal_file_lose_and_duplicate_nothing(journal_two_workers):
    check_two_workers(journal_two_workers)


def test_two_workers_on_postgres_lose_and_duplicate_nothing(postgres_two_workers):
    check_two_workers(postgres_two_workers)


def test_workers_starting_together_on_a_fresh_database_all_get_its_tables(postgres):
    """Optuna creates its tables on first use; workers starting at once race to do it (one
    wins, the others hit duplicate-key errors): open_storage tries again."""
    url = postgres.fresh_database()
    errors = run_together(4, lambda: open_storage(url, grace_period_s=default_grace_period_s()))
    assert not errors, errors


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


@pytest.mark.parametrize("backend", ["journal", "postgres"])
def test_concurrent_workers_create_the_study_and_its_references_once(backend, request, tmp_path):
    """The race itself, without trials: four workers opening a new study at the same moment.
    Exactly one creates it; the reference trials are enqueued once; the others wait for it to
    be ready and agree on its identity."""
    ctx = tiny_context()
    url = f"journal:{tmp_path / 'race.journal'}" if backend == "journal" else request.getfixturevalue("postgres").fresh_database()
    results: list = []
    errors = run_together(4, lambda: results.append(autotune.search.study.open_study("race", open_storage(url), ctx, seed=0)))
    assert not errors, errors
    assert sorted(is_new for _, is_new in results) == [False, False, False, True]
    study = load(url, "race")
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert sorted(t.user_attrs["reference"] for t in waiting) == ["baseline", "checklist"]
    assert study.user_attrs["identity"] == ctx.identity()


def test_workers_joining_together_get_their_own_sampler_seed():
    """Same seed, same number of trials, two processes: different seeds, or the two workers
    would propose the same configurations in lockstep. A resume gets a new one too."""
    assert autotune.search.study.worker_seed(0, 2, pid=1001) != autotune.search.study.worker_seed(0, 2, pid=1002)
    assert autotune.search.study.worker_seed(0, 2, pid=1001) != autotune.search.study.worker_seed(0, 3, pid=1001)


def test_a_study_whose_creator_died_before_setting_it_up_is_set_up_by_the_next_worker(tmp_path, monkeypatch):
    monkeypatch.setattr(autotune.search.study, "JOIN_WAIT_S", 0.5)
    storage = open_storage(f"journal:{tmp_path / 's.journal'}")
    optuna.create_study(study_name="half", storage=storage, direction="maximize")  # and then the creator died
    study, is_new = autotune.search.study.open_study("half", storage, tiny_context(), seed=0)
    assert is_new and len(study.get_trials(states=(TrialState.WAITING,))) == 2


def test_sqlite_with_a_second_live_tuner_warns_and_points_elsewhere(tmp_path, caplog):
    storage = open_storage(f"sqlite:///{tmp_path / 's.db'}")
    study = optuna.create_study(study_name="s", storage=storage)
    sleeper = subprocess.Popen(["sleep", "60"])  # the other tuner, alive
    try:
        trial = study.ask()
        trial.set_user_attr("host", socket.gethostname())
        trial.set_user_attr("tuner_pid", sleeper.pid)
        with caplog.at_level(logging.WARNING):
            assert autotune.search.run.warn_if_sqlite_shared(study, f"sqlite:///{tmp_path / 's.db'}")
        assert "journal:PATH" in caplog.text and "PostgreSQL" in caplog.text and str(sleeper.pid) in caplog.text
    finally:
        sleeper.kill()
        sleeper.wait()
    caplog.clear()
    assert not autotune.search.run.warn_if_sqlite_shared(study, "sqlite:///x.db")  # its tuner is gone: no warning


# --- row 6 on one host: --devices ------------------------------------------------------------------

FAKE_UUIDS = ["GPU-aaaa1111-0000-0000-0000-000000000000", "GPU-bbbb2222-0000-0000-0000-000000000000",
              "GPU-cccc3333-0000-0000-0000-000000000000", "GPU-dddd4444-0000-0000-0000-000000000000"]


def test_devices_are_parsed_and_pinned_by_uuid():
    assert parse_devices("0, 1,3") == ["0", "1", "3"]
    devices = resolve_devices(["0", "1", "3"], FAKE_UUIDS)
    assert [(d.index, d.pin) for d in devices] == [(0, FAKE_UUIDS[0]), (1, FAKE_UUIDS[1]), (3, FAKE_UUIDS[3])]
    assert resolve_devices(["GPU-cccc"], FAKE_UUIDS) == [WorkerDevice(2, FAKE_UUIDS[2])]
    # Without NVML: the indices as given, pinned in PCI bus order.
    assert resolve_devices(["0", "2"], None) == [WorkerDevice(0, "0"), WorkerDevice(2, "2")]


@pytest.mark.parametrize("text, uuids, message", [
    ("0,,1", FAKE_UUIDS, "expected GPU indices or UUIDs"),
    ("0,x", FAKE_UUIDS, "'x' is neither a GPU index"),
    ("1,1", FAKE_UUIDS, "1 given more than once"),
    ("7", FAKE_UUIDS, "GPU 7 does not exist; the GPUs here are 4 (0, 1, 2, 3)"),
    ("0,GPU-aaaa", FAKE_UUIDS, "the same GPU is given twice"),
    ("GPU-aaaa", None, "without NVML UUIDs cannot be matched"),
])
def test_bad_devices_are_one_clear_error(text, uuids, message):
    from autotune.errors import UsageError

    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve_devices(parse_devices(text), uuids)


def test_n_trials_is_the_total_split_evenly():
    assert split_trials(10, 4) == [3, 3, 2, 2]
    assert split_trials(4, 4) == [1, 1, 1, 1]
    assert split_trials(2, 4) == [1, 1, 0, 0]
    assert sum(split_trials(101, 8)) == 101


def test_worker_commands_pin_one_gpu_each_and_keep_the_password_off_the_command_line():
    settings = autotune.search.run.SearchSettings(model="gpt2", n_trials=10, space="my.yaml", seq_len=512, timeout_s=3600,
                                              warmup=2, steps=10, seed=3, recipe="out.json")
    url = "postgresql://tuner:hunter2@db/autotune"
    devices = resolve_devices(["0", "1", "2", "3"], FAKE_UUIDS)
    plans = plan_workers(settings, devices, study="gpt2-h200-fleet", storage_url=url, memory_limit_bytes=123456789,
                         trial_timeout_s=600.0, verbose=True)
    assert [p.n_trials for p in plans] == [3, 3, 2, 2]
    for plan, gpu in zip(plans, FAKE_UUIDS):
        cmd = plan.command
        assert cmd[:5] == [sys.executable, "-m", "autotune", "-v", "search"] and "--worker" in cmd
        opts = dict(zip(cmd[5:], cmd[6:]))
        assert opts["--device"] == "cuda:0"  # the only GPU it can see
        assert opts["--study"] == "gpt2-h200-fleet" and opts["--memory-limit"] == "123456789"
        assert opts["--trial-timeout"] == "600s" and opts["--timeout"] == "3600s" and opts["--n-trials"] == str(plan.n_trials)
        assert (opts["--space"], opts["--seq-len"], opts["--warmup"], opts["--steps"], opts["--seed"], opts["--recipe"]) == \
            ("my.yaml", "512", "2", "10", "3", "out.json")
        assert "--storage" not in cmd and not any("hunter2" in part for part in cmd)
        assert plan.env == {"CUDA_VISIBLE_DEVICES": gpu, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", STORAGE_ENV: url,
                            "PYTHONUNBUFFERED": "1"}
    # Fewer trials than GPUs: idle GPUs get no worker.
    assert len(plan_workers(autotune.search.run.SearchSettings(n_trials=2), devices, study="s", storage_url=url,
                            memory_limit_bytes=1, trial_timeout_s=1.0)) == 2


def test_worker_command_is_accepted_by_the_search_command(tmp_path):
    """The built command parses: run it with --help-free validation by pointing it at a bad
    model, which fails in prepare() with exit 2, after click accepted every option."""
    settings = autotune.search.run.SearchSettings(model="no-such-model", n_trials=1, space=str(TINY_SPACE), timeout_s=60)
    cmd = worker_command(settings, study="s", memory_limit_bytes=10**9, trial_timeout_s=30.0, n_trials=1)
    result = CliRunner().invoke(main, cmd[3:], env={STORAGE_ENV: f"journal:{tmp_path / 'x.journal'}"})
    assert result.exit_code == 2 and "unknown model 'no-such-model'" in result.stderr, result.output


def test_devices_parent_sets_up_the_study_once_warns_on_sqlite_and_sums_up(tmp_path, monkeypatch, caplog):
    """The --devices parent end to end, with four fake GPUs: NVML answers with fake UUIDs, the
    context is the CPU's, and the workers are not started (supervise is replaced)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(autotune.device, "visible_gpu_uuids", lambda: FAKE_UUIDS)
    real_prepare = autotune.search.run.prepare
    monkeypatch.setattr(autotune.search.run, "prepare", lambda s: real_prepare(s.__class__(**{**s.__dict__, "device": "cpu"})))
    seen = {}

    def fake_supervise(plans):
        seen["plans"] = plans
        return [0, 0, 0, 0], False

    monkeypatch.setattr(autotune.search.fleet, "supervise", fake_supervise)
    settings = autotune.search.run.SearchSettings(model="gpt2-tiny", n_trials=8, space=str(TINY_SPACE), study="fleet",
                                              memory_limit_bytes=2 * 1024**3)
    with caplog.at_level(logging.WARNING):
        result = autotune.search.fleet.run_workers(settings, "0,1,2,3")
    assert "4 workers on sqlite:///studies/fleet.db" in caplog.text and "journal:PATH" in caplog.text
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in seen["plans"]] == FAKE_UUIDS
    assert [p.n_trials for p in seen["plans"]] == [2, 2, 2, 2]
    study = load("sqlite:///studies/fleet.db", "fleet")
    assert len(study.get_trials(states=(TrialState.WAITING,))) == 2 and study.user_attrs["identity"]
    assert result.new_study and result.worker_failures == [] and result.summary.best is None


SUPERVISED_CHILD = textwrap.dedent("""
    import os, signal, sys, time
    def stop(*_):
        open(sys.argv[1], "w").write("interrupted")
        print("recorded the trial as interrupted", flush=True)
        sys.exit(130)
    signal.signal(signal.SIGINT, stop)
    print("a warning", file=sys.stderr, flush=True)  # before "ready": the test signals on "ready"
    print("ready", os.environ["CUDA_VISIBLE_DEVICES"], flush=True)
    time.sleep(120)
""")

SUPERVISOR = textwrap.dedent("""
    import json, sys
    from autotune.search.fleet import WorkerDevice, WorkerPlan, supervise
    child, tmp = sys.argv[1], sys.argv[2]
    plans = [WorkerPlan(WorkerDevice(i, f"GPU-{i}"), 1, [sys.executable, "-c", child, f"{tmp}/marker{i}"],
                        {"CUDA_VISIBLE_DEVICES": f"GPU-{i}"}) for i in range(2)]
    codes, interrupted = supervise(plans)
    print(json.dumps({"codes": codes, "interrupted": interrupted}), flush=True)
""")


def _start_supervisor(tmp_path: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SUPERVISOR, SUPERVISED_CHILD, str(tmp_path)], cwd=tmp_path,
                            env=env_with_repo(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _wait_ready(proc: subprocess.Popen, n: int) -> list[str]:
    lines = []
    while sum("ready" in line for line in lines) < n:
        line = proc.stdout.readline()
        assert line, "the supervisor ended early"
        lines.append(line)
    return lines


def test_devices_parent_forwards_ctrl_c_and_waits_for_every_worker(tmp_path):
    proc = _start_supervisor(tmp_path)
    lines = _wait_ready(proc, 2)
    assert sorted(l.strip() for l in lines if "ready" in l) == ["[gpu0] ready GPU-0", "[gpu1] ready GPU-1"]
    os.kill(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert json.loads(out.strip().splitlines()[-1]) == {"codes": [130, 130], "interrupted": True}
    assert "[gpu0] recorded the trial as interrupted" in out and "[gpu1] a warning" in err
    assert all((tmp_path / f"marker{i}").read_text() == "interrupted" for i in range(2))


def test_devices_workers_stop_when_the_parent_is_killed(tmp_path):
    proc = _start_supervisor(tmp_path)
    _wait_ready(proc, 2)
    proc.kill()  # SIGKILL: no chance to forward anything; PR_SET_PDEATHSIG sends the workers SIGINT
    proc.wait()
    wait_for(lambda: all((tmp_path / f"marker{i}").exists() for i in range(2)), 20, "the workers to stop")


# --- rows 4 and 5: SIGKILL and Ctrl-C of a real tuner ------------------------------------------------


@pytest.fixture
def seeded(journal_two_workers, tmp_path) -> tuple[str, str]:
    """A copy of the two-worker journal study, whose reference trials are done: the tests below
    resume it without paying for the references again (the checklist's compile included)."""
    src = journal_two_workers.url[len("journal:"):]
    shutil.copy(src, tmp_path / "study.journal")
    return f"journal:{tmp_path / 'study.journal'}", journal_two_workers.study


def test_ctrl_c_kills_the_trial_records_it_interrupted_and_writes_the_best_recipe(seeded, tmp_path):
    url, name = seeded
    tuner = start_tuner(*search_args(url, name, 8), cwd=tmp_path)
    running = wait_for(lambda: running_trial_with_pid(url, name) or tuner.poll() is not None, 180, "a running trial")
    assert tuner.poll() is None, tuner.communicate()[1][-3000:]
    time.sleep(0.5)  # inside the trial, not at its very start
    tuner.send_signal(signal.SIGINT)
    out, err = tuner.communicate(timeout=60)
    assert tuner.returncode == 130, err[-3000:]
    assert "Error: interrupted" in err and err.strip().splitlines()[-1].startswith("Error: interrupted")
    trial = next(t for t in load(url, name).get_trials() if t.number == running.number)
    assert trial.state == TrialState.FAIL
    assert trial.user_attrs["outcome"] == outcomes.INTERRUPTED and "Ctrl-C" in trial.user_attrs["reason"]
    assert not pid_alive(running.user_attrs["trial_pid"]), "the trial process outlived the Ctrl-C"
    recipe = json.loads((tmp_path / "recipes" / f"{name}.json").read_text())
    assert recipe["format"] == "autotune.recipe" and recipe["study"]["name"] == name
    assert not any(t.state == TrialState.RUNNING for t in load(url, name).get_trials())


def test_sigkill_of_the_tuner_kills_its_trial_and_the_same_command_resumes(seeded, tmp_path):
    url, name = seeded
    tuner = start_tuner(*search_args(url, name, 8), cwd=tmp_path)
    running = wait_for(lambda: running_trial_with_pid(url, name) or tuner.poll() is not None, 180, "a running trial")
    assert tuner.poll() is None, tuner.communicate()[1][-3000:]
    before = {t.number: t.state for t in load(url, name).get_trials()}
    tuner.kill()  # SIGKILL: the tuner gets no say
    tuner.communicate()
    # PR_SET_PDEATHSIG: the trial process dies with its tuner, it does not run on unattended.
    wait_for(lambda: not pid_alive(running.user_attrs["trial_pid"]), 10, "the trial process to die with its tuner")
    assert load(url, name).get_trials()[running.number].state == TrialState.RUNNING  # nobody could record it

    resumed = run_autotune(*search_args(url, name, 1), cwd=tmp_path)  # the same command, one more trial
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"failed 1 trial(s) left running by a killed tuner: [{running.number}]" in resumed.stderr
    trials = load(url, name).get_trials()
    assert sorted(t.number for t in trials) == list(range(len(trials)))  # no number repeats
    killed = trials[running.number]
    assert killed.state == TrialState.FAIL and killed.user_attrs["outcome"] == outcomes.INTERRUPTED
    assert all(trials[n].state == state for n, state in before.items() if state in FINISHED)  # all kept
    retry = [t for t in trials if t.system_attrs.get("failed_trial") == running.number]
    assert len(retry) == 1 and retry[0].state in FINISHED and retry[0].params == killed.params
    assert retry[0].user_attrs.get("tuner_pid") != killed.user_attrs.get("tuner_pid")
    assert not any(t.state in (TrialState.RUNNING, TrialState.WAITING) for t in trials)


def test_orphaned_trial_of_a_dead_tuner_is_failed_at_resume_and_retried_once(tmp_path):
    """On one host, without waiting for any heartbeat: the tuner's pid is gone, so its
    RUNNING trial is failed and queued again; a live tuner's trial is left alone."""
    study = optuna.create_study(study_name="o", storage=open_storage(f"journal:{tmp_path / 'o.journal'}"))
    dead = subprocess.Popen(["true"])
    dead.wait()
    alive = subprocess.Popen(["sleep", "60"])
    try:
        for pid in (dead.pid, alive.pid):
            t = study.ask({"x": optuna.distributions.CategoricalDistribution([1, 2])})
            for key, value in {"host": socket.gethostname(), "tuner_pid": pid, "trial_pid": 1, "config": {}}.items():
                t.set_user_attr(key, value)
        assert autotune.search.study.fail_orphaned_trials(study) == [0]
        trials = study.get_trials()
        assert trials[0].state == TrialState.FAIL and trials[0].user_attrs["outcome"] == outcomes.INTERRUPTED
        assert trials[1].state == TrialState.RUNNING  # its tuner is alive: not ours to touch
        (retry,) = study.get_trials(states=(TrialState.WAITING,))
        assert retry.params == trials[0].params and retry.system_attrs["failed_trial"] == 0
        # The retry does not inherit the dead attempt's host and pids (it would look orphaned).
        assert "tuner_pid" not in retry.user_attrs and "trial_pid" not in retry.user_attrs
        assert autotune.search.study.fail_orphaned_trials(study) == []  # idempotent
    finally:
        alive.kill()
        alive.wait()


# --- heartbeats: a killed worker on another host (RDB) ---------------------------------------------

HEARTBEAT_WORKER = textwrap.dedent("""
    import sys, time, optuna
    from autotune.search.storage import default_grace_period_s, open_storage
    storage = open_storage(sys.argv[1], grace_period_s=default_grace_period_s())
    study = optuna.load_study(study_name=sys.argv[2], storage=storage)
    def objective(trial):
        trial.suggest_int("x", 0, 9)
        trial.set_user_attr("host", "another-host")  # not this host: only its heartbeat can tell
        print("running", trial.number, flush=True)
        time.sleep(600)
    study.optimize(objective, n_trials=1)
""")


def test_heartbeat_fails_and_retries_a_killed_workers_trial(postgres, tmp_path, monkeypatch):
    """Worker A (a process with autotune's storage settings) is killed with -9 mid-trial. Worker B
    calls optimize, which runs fail_stale_trials first: after the grace period A's trial is FAIL
    and its retry (same parameters) runs in B. AUTOTUNE_HEARTBEAT_S=1: grace = 4 s."""
    monkeypatch.setenv("AUTOTUNE_HEARTBEAT_S", "1")
    url, name = postgres.url, f"hb-{uuid.uuid4().hex[:6]}"
    storage = open_storage(url, grace_period_s=default_grace_period_s())
    assert (storage.heartbeat_interval, storage.grace_period) == (1, 4)
    study = optuna.create_study(study_name=name, storage=storage, direction="maximize")
    a = subprocess.Popen([sys.executable, "-c", HEARTBEAT_WORKER, url, name], env=env_with_repo(AUTOTUNE_HEARTBEAT_S="1"),
                         stdout=subprocess.PIPE, text=True)
    assert a.stdout.readline().startswith("running 0")
    time.sleep(1.5)  # a few heartbeats recorded
    a.kill()
    killed_at = time.monotonic()
    a.wait()
    failed_at = None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    while time.monotonic() - killed_at < 30:
        study.optimize(lambda t: float(t.suggest_int("x", 0, 9)), n_trials=1)  # B: one trial at a time
        trials = study.get_trials()
        if trials[0].state == TrialState.FAIL:
            failed_at = time.monotonic()
            break
    assert failed_at is not None, "the killed worker's trial was never failed"
    retry = [t for t in study.get_trials() if t.system_attrs.get("failed_trial") == 0]
    assert len(retry) == 1 and retry[0].state == TrialState.COMPLETE and retry[0].params == trials[0].params
    assert "host" not in retry[0].user_attrs
    print(f"\nheartbeat 1 s, grace 4 s: killed worker's trial failed and retried {failed_at - killed_at:.1f} s after the kill "
          f"(defaults: heartbeat 30 s, grace {4 * 30} s)")
    assert 3 <= failed_at - killed_at < 10  # the last beat came up to 1 s before the kill


def test_heartbeat_interval_comes_from_the_environment(monkeypatch):
    from autotune.errors import UsageError

    monkeypatch.delenv("AUTOTUNE_HEARTBEAT_S", raising=False)
    assert default_grace_period_s() == 120
    monkeypatch.setenv("AUTOTUNE_HEARTBEAT_S", "5")
    assert default_grace_period_s() == 20
    monkeypatch.setenv("AUTOTUNE_HEARTBEAT_S", "soon")
    with pytest.raises(UsageError, match="AUTOTUNE_HEARTBEAT_S: expected a whole number of seconds"):
        default_grace_period_s()


def test_retry_keeps_the_reference_and_drops_the_attempt():
    study = optuna.create_study()
    study.enqueue_trial({}, user_attrs={"reference": "baseline"})
    trial = study.ask()
    trial.set_user_attr("tuner_pid", 12345)
    study.tell(trial, state=TrialState.FAIL)
    RetryStaleTrial(max_retry=1)(study, study.trials[0])
    (retry,) = study.get_trials(states=(TrialState.WAITING,))
    assert retry.user_attrs == {"reference": "baseline"} and retry.system_attrs["failed_trial"] == 0
    # The retry failing in turn is not retried again: once is the limit.
    retried = study.ask()
    assert retried.number == retry.number
    study.tell(retried, state=TrialState.FAIL)
    RetryStaleTrial(max_retry=1)(study, study.trials[retry.number])
    assert study.get_trials(states=(TrialState.WAITING,)) == []


# --- row 8: NVML missing or failing ----------------------------------------------------------------


@pytest.fixture
def fresh_nvml(monkeypatch):
    monkeypatch.setitem(autotune.device.nvml._nvml_state, "ok", None)
    monkeypatch.delitem(autotune.device.nvml._nvml_state, "module", raising=False)
    yield
    autotune.device.nvml._nvml_state.clear()
    autotune.device.nvml._nvml_state["ok"] = None


def test_nvml_missing_is_none_not_an_error(fresh_nvml, caplog):
    with caplog.at_level(logging.WARNING):
        assert autotune.device.nvml.load_nvml() is None  # no driver on this machine
        assert autotune.device.nvml.visible_gpu_uuids() is None
    assert "NVML" not in caplog.text  # a CPU machine has nothing to fall back from


def test_nvml_failing_on_a_gpu_machine_is_said_once(fresh_nvml, monkeypatch, caplog):
    import types

    broken = types.SimpleNamespace(nvmlInit=lambda: (_ for _ in ()).throw(RuntimeError("NVML Shared Library Not Found")))
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    with caplog.at_level(logging.WARNING, logger="autotune.device.nvml"):
        for _ in range(3):
            assert autotune.device.nvml.load_nvml() is None
    warnings = [r for r in caplog.records if "NVML unavailable" in r.getMessage()]
    assert len(warnings) == 1 and "torch's allocator" in warnings[0].getMessage()


def test_memory_limit_is_still_enforced_on_cpu_without_nvml(fresh_nvml):
    from autotune.config import RunSpec, TrainConfig
    from autotune.measure.loop import measure

    assert autotune.device.nvml.load_nvml() is None
    spec = RunSpec(model="gpt2-tiny", device="cpu", warmup=1, steps=2, memory_limit_bytes=64 * 1024**2)
    m = measure(spec, TrainConfig(token_budget=1024))
    assert m.outcome == outcomes.OVER_MEMORY_LIMIT and m.peak_memory_source == "rss"
    assert m.peak_memory_bytes > 64 * 1024**2


# --- rows 9 and 10: bad input ----------------------------------------------------------------------


def _files_under(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


def _bad_input(tmp_path: Path, monkeypatch, args: list[str]):
    monkeypatch.chdir(tmp_path)
    before = _files_under(tmp_path)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1, result.stderr
    assert _files_under(tmp_path) == before, "bad input must write nothing"
    return result.stderr


# test_search.py covers the search command's bad spaces, memory limits, models and unreachable
# storage; here: --devices, and recipes refused by the commands that read them.


def test_bad_devices_for_search(tmp_path, monkeypatch):
    assert "--devices:" in _bad_input(tmp_path, monkeypatch, ["search", "--devices", "0,zero", "--model", "gpt2-tiny"])


def _recipe_text() -> str:
    from autotune.config import TrainConfig
    from autotune.recipe.recipe import Recipe

    return json.dumps(Recipe(config=TrainConfig(), model={"name": "gpt2-tiny"}, data="synthetic", measured={},
                             reference_speedups={}, hardware={}, software={}, study={}, created="now").to_dict())


@pytest.mark.parametrize("command", [["export"], ["verify"]])
def test_recipe_of_a_newer_format_is_refused_by_the_commands(tmp_path, monkeypatch, command):
    raw = json.loads(_recipe_text()) | {"version": 99}
    (tmp_path / "new.json").write_text(json.dumps(raw))
    message = _bad_input(tmp_path, monkeypatch, command + ["new.json"])
    assert "new.json" in message and "newer" in message


@pytest.mark.parametrize("command", [["export"], ["verify"]])
def test_recipe_with_python_objects_is_refused_and_nothing_runs(tmp_path, monkeypatch, command):
    marker = tmp_path / "pwned"
    (tmp_path / "evil.yaml").write_text(f'format: autotune.recipe\nversion: 1\nconfig: {{}}\n'
                                        f'data: !!python/object/apply:os.system ["touch {marker}"]\n')
    message = _bad_input(tmp_path, monkeypatch, command + ["evil.yaml"])
    assert "evil.yaml" in message and not marker.exists()


# --- row 11: passwords -----------------------------------------------------------------------------


def test_redact_hides_both_places_a_password_can_be():
    assert redact("postgresql://tuner:secret@db/autotune") == "postgresql://tuner:***@db/autotune"
    assert redact("postgresql+psycopg2://u:p/w:x@h:5/d") == "postgresql+psycopg2://u:***@h:5/d"
    assert redact("postgresql://u@h/d?sslmode=require&password=secret") == "postgresql://u@h/d?sslmode=require&password=***"
    assert redact("journal:studies/x.journal") == "journal:studies/x.journal"


def test_the_password_never_shows_in_output_logs_recipes_or_reports(postgres_two_workers):
    run = postgres_two_workers
    password = run.url.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]
    assert password
    show = run_autotune("-v", "show", "--study", run.study, "--storage", run.url, "--json", cwd=run.cwd)
    export = run_autotune("-v", "export", "--study", run.study, "--storage", run.url, "-o", "exported.json", cwd=run.cwd)
    report = run_autotune("-v", "report", "--study", run.study, "--storage", run.url, "--out", "report", cwd=run.cwd)
    assert show.returncode == export.returncode == report.returncode == 0, show.stderr + export.stderr + report.stderr
    assert (run.cwd / "report" / "report.md").exists()
    texts = [r.stdout + r.stderr for r in [*run.results, show, export, report]]
    texts += [p.read_text(errors="replace") for p in run.cwd.rglob("*") if p.is_file()]
    assert all(password not in text for text in texts)
    recipe = json.loads((run.cwd / "recipes" / f"{run.study}.json").read_text())
    assert recipe["study"]["storage"] == redact(run.url) and "***" in recipe["study"]["storage"]
    assert json.loads(show.stdout)["study"] == run.study


# --- row 12: a noisy machine -----------------------------------------------------------------------


def tiny_context():
    from autotune.config import RunSpec
    from autotune.device import describe
    from autotune.search.space_file import load_space

    spec = RunSpec(model="gpt2-tiny", device="cpu", warmup=1, steps=4, memory_limit_bytes=2 * 1024**3)
    return autotune.search.study.StudyContext(spec=spec, device=describe("cpu"),
                                       space=load_space(TINY_SPACE, n_layer=2, seq_len=128),
                                       memory_limit_bytes=2 * 1024**3, trial_timeout_s=60)


def test_a_noisy_run_takes_a_second_window_then_is_flagged_unstable(monkeypatch):
    """Noise cannot be ordered on a shared CPU: a target no run can meet stands for it."""
    import autotune.measure
    from autotune.config import RunSpec, TrainConfig

    monkeypatch.setattr(autotune.measure.loop, "CV_TARGET", -1.0)
    m = autotune.measure.loop.measure(RunSpec(model="gpt2-tiny", device="cpu", warmup=1, steps=2, min_time_s=0),
                                  TrainConfig(token_budget=1024))
    assert m.outcome == outcomes.OK and m.unstable is True
    assert m.steps == 4 and m.step_time_cv is not None  # two windows of 2 steps: more samples before judging


def test_a_trial_flagged_unstable_keeps_the_flag(monkeypatch):
    from autotune.measure.measurement import Measurement
    from autotune.trial.runner import TrialResult

    measurement = Measurement(config={}, outcome="ok", tokens_per_sec=1000.0, peak_memory_bytes=10**8,
                              step_time_cv=0.31, unstable=True)
    monkeypatch.setattr(autotune.search.objective, "run_trial", lambda *a, **k: TrialResult("ok", None, measurement, 1.0, {"total": 1.0}))
    study = optuna.create_study(direction="maximize")
    study.optimize(autotune.search.objective.Objective(tiny_context()), n_trials=1)
    (trial,) = study.trials
    assert trial.state == TrialState.COMPLETE
    assert trial.user_attrs["measurement"]["unstable"] is True and trial.user_attrs["measurement"]["step_time_cv"] == 0.31
