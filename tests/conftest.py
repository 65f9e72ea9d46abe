"""Shared test set-up: one intra-op thread per process, the repository root on sys.path (a
user-style model factory `tests.fixture_models:make_llama` imports the way `autotune bench
--model ...` imports one), the spies on measure()'s data path, and the fixtures that cost a
search or a server, each made once for the whole session and shared by the modules
that read it:

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
import sys
from pathlib import Path

# One intra-op thread in this process and in every process the tests start (trials, tuners,
# scripts inherit it): gpt2-tiny's small matmuls gain nothing from a second thread, and where
# the cores are shared, OpenMP threads waiting on each other make a step several times slower.
# Set before torch is imported. No test is about threads.
os.environ["OMP_NUM_THREADS"] = "1"

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import glob  # noqa: E402
import pwd  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import uuid  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Callable, NamedTuple  # noqa: E402

import optuna  # noqa: E402
import pytest  # noqa: E402
from click.testing import Result  # noqa: E402

from tests.helpers import (  # noqa: E402
    A100,
    FAST,
    SEARCHED_SEED,
    STUDY,
    TINY_SPACE,
    BatchRecord,
    TwoWorkers,
    in_repo_env,
    invoke,
    record_batches,
    run_two_workers,
    study_settings,
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
def workdir(tmp_path, monkeypatch) -> Path:
    """The test's tmp dir as the working directory; trial processes can import tests.*."""
    monkeypatch.chdir(tmp_path)
    in_repo_env(monkeypatch)
    return tmp_path


# --- searches shared by the session -------------------------------------------------------------------


class Searched(NamedTuple):
    where: Path  # the working directory: studies/gpt2-tiny-cpu.db and recipes/gpt2-tiny-cpu.json
    result: Result


@pytest.fixture(scope="session")
def searched(tmp_path_factory) -> Searched:
    """`autotune search` run once through the CLI with 4 trials (the two references + two
    sampled, seeded: see SEARCHED_SEED) in a working directory of its own. Tests read it; one
    that adds trials works on a copy."""
    where = tmp_path_factory.mktemp("search")
    args = ["--model", "gpt2-tiny", *FAST, "--n-trials", "4", "--space", str(TINY_SPACE)]
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(where)
        result = invoke("search", *args, "--seed", str(SEARCHED_SEED))
    return Searched(where, result)


@dataclass
class CompareStudies:
    dir: Path  # a.db, b.db, both.db
    warm_expected: list[tuple[int, dict]]  # (trial number in a, config) b was warm-started with, best first


@pytest.fixture(scope="session")
def compare_studies(searched, tmp_path_factory) -> CompareStudies:
    """a.db: study "a", a copy of `searched` (CPU, 4 trials on tests/spaces/tiny.yaml); b.db:
    study "b" on tests/spaces/compare.yaml, warm-started from a (3 trials: its references,
    then a's best searched configuration; a's next best wait in its queue), then relabelled
    as an A100's; both.db: copies of the two, for the #study syntax."""
    from autotune.search.run import run_search
    from autotune.search.storage import load_ref
    from autotune.search.warm_start import warm_start_candidates

    tmp = tmp_path_factory.mktemp("studies")
    optuna.copy_study(
        from_study_name=STUDY,
        from_storage=f"sqlite:///{searched.where}/studies/{STUDY}.db",
        to_storage=f"sqlite:///{tmp}/a.db",
        to_study_name="a",
    )
    warm = [(t.number, t.user_attrs["config"]) for t in warm_start_candidates(load_ref(str(tmp / "a.db")), 5)]
    b = run_search(study_settings(tmp, "b", n_trials=3, seed=1, warm_start_from=str(tmp / "a.db"))).study
    b.set_user_attr("hardware", A100)
    for name in ("a", "b"):
        optuna.copy_study(
            from_study_name=name, from_storage=f"sqlite:///{tmp}/{name}.db", to_storage=f"sqlite:///{tmp}/both.db"
        )
    return CompareStudies(tmp, warm)


@pytest.fixture
def studies(compare_studies) -> Path:
    """Where compare_studies keeps a.db, b.db and both.db."""
    return compare_studies.dir


@pytest.fixture(scope="session")
def journal_two_workers(tmp_path_factory) -> TwoWorkers:
    cwd = tmp_path_factory.mktemp("journal-workers")
    return run_two_workers(f"journal:{cwd / 'study.journal'}", cwd)


@pytest.fixture(scope="session")
def postgres_two_workers(postgres, tmp_path_factory) -> TwoWorkers:
    cwd = tmp_path_factory.mktemp("pg-workers")
    # The URL carries a password and is given on the command line, with -v: the password
    # test checks it never comes back out.
    return run_two_workers(postgres.password_url(), cwd, "-v")


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
