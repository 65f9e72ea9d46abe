"""A resumed study keeps its rules (issue 14, item 4); a failed --warm-start-from leaves nothing
behind (item 14); a study is never left half made, and one that was is set up at once (item 8).
Trials are faked (no process): what is tested is what the study accepts and records."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner

from autotune.cli import main
from autotune.errors import UsageError
from autotune.search.run import run_search
from autotune.study.storage import load_study, open_storage
from tests.attack_helpers import FAST, fake_trials, files_under, settings

# One pytest-xdist worker runs this module, so that its module-scoped study (resumable_made: a search)
# is made once, not in each worker.
pytestmark = pytest.mark.xdist_group("resume-rules")
optuna.logging.set_verbosity(optuna.logging.WARNING)
STUDY = "gpt2-tiny-cpu"
MiB = 1 << 20
PEAK = int(338.5 * MiB)
CPU_DDP = str(Path(__file__).resolve().parents[2] / "search_spaces" / "cpu_ddp.yaml")


def search(*args: str):
    return CliRunner().invoke(main, ["search", *FAST, *args])


@pytest.fixture(scope="module")
def resumable_made(tmp_path_factory) -> Path:
    """A study made with a 21 GiB limit, --steps 4, --min-time 0, its studies/ and recipes/ in a
    folder of their own; trials are faked, and every configuration peaks at 338.5 MiB. Made once
    a module (a search costs seconds); each test gets its own copy (`resumable`)."""
    folder = tmp_path_factory.mktemp("resumable")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        fake_trials(mp, peak=PEAK)
        result = search("--memory-limit", "21GiB", "--n-trials", "3")
    assert result.exit_code == 0, result.output
    return folder


@pytest.fixture
def resumable(resumable_made, tmp_path, monkeypatch):
    """A copy of that study in tmp_path, the working folder, its trials faked the same way."""
    shutil.copytree(resumable_made, tmp_path, dirs_exist_ok=True)
    monkeypatch.chdir(tmp_path)
    fake_trials(monkeypatch, peak=PEAK)
    return tmp_path


def test_resuming_with_another_memory_limit_is_refused(resumable):
    """The attacker's reproduction: a best at 338.5 MiB under "memory limit 300 MiB"."""
    before = files_under(resumable)
    trials = len(load_study(STUDY, None).trials)
    result = search("--memory-limit", "300MiB", "--n-trials", "2")
    assert result.exit_code == 2
    assert result.stderr == (
        f"Error: study '{STUDY}' was measured with memory limit 21.00 GiB (22548578304 bytes), this run 300.00 MiB: "
        "trials measured under other rules cannot be compared. Resume it with its settings, or start a new study "
        "(--new-study, or --study NAME)\n"
    )
    assert len(load_study(STUDY, None).trials) == trials
    assert files_under(resumable) == before


@pytest.mark.slow
def test_resuming_with_another_number_of_ranks_is_refused(tmp_path, monkeypatch):
    # tokens/s of 2 ranks is another figure than one rank's: the study stays at its world size
    monkeypatch.chdir(tmp_path)
    fake_trials(monkeypatch, peak=PEAK)
    made = search("--memory-limit", "21GiB", "--n-trials", "2", "--nproc-per-node", "2", "--space", CPU_DDP)
    assert made.exit_code == 0, made.output
    assert load_study(f"{STUDY}-2ranks", None).user_attrs["run"]["nproc_per_node"] == 2
    before = files_under(tmp_path)
    # the same space, and the default one of a single rank (another space hash): the ranks are named
    for space in (["--space", CPU_DDP], []):
        result = search("--memory-limit", "21GiB", "--n-trials", "1", "--study", f"{STUDY}-2ranks", *space)
        assert result.exit_code == 2, result.output
        assert "was measured with --nproc-per-node 2, this run 1" in result.stderr, result.stderr
        assert "hash" not in result.stderr and len(result.stderr.splitlines()) == 1
        assert files_under(tmp_path) == before


@pytest.mark.slow
def test_the_default_study_name_says_how_many_ranks(tmp_path, monkeypatch):
    """A search of 1 rank and one of 2 of a model in one folder are two studies (issue D, #9:
    they shared `gpt2-tiny-cpu`, and the second was refused naming two space hashes); a single
    rank's name is what it always was, so its studies resume."""
    from autotune.search.training import default_study_name

    assert default_study_name("gpt2-tiny", "cpu", 1) == "gpt2-tiny-cpu"
    assert default_study_name("hf:gpt2", "nvidia-h100-80gb-hbm3", 2) == "hf-gpt2-nvidia-h100-80gb-hbm3-2ranks"
    monkeypatch.chdir(tmp_path)
    fake_trials(monkeypatch, peak=PEAK)
    for ranks in (["--nproc-per-node", "2", "--space", CPU_DDP], []):
        result = search("--memory-limit", "21GiB", "--n-trials", "1", *ranks)
        assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "studies").glob("*.db")) == [f"{STUDY}-2ranks.db", f"{STUDY}.db"]
    assert sorted(p.name for p in (tmp_path / "recipes").iterdir()) == [f"{STUDY}-2ranks.json", f"{STUDY}.json"]


@pytest.mark.parametrize(
    "args, said", [(["--steps", "20"], "--steps 4, this run 20"), (["--min-time", "2"], "--min-time 0, this run 2")]
)
def test_resuming_with_another_timed_window_is_refused(resumable, args, said):
    result = search(*args, "--memory-limit", "21GiB", "--n-trials", "1")
    assert result.exit_code == 2 and said in result.stderr, result.output


@pytest.mark.slow
def test_resuming_without_a_limit_keeps_the_studys(resumable):
    result = search("--n-trials", "1")
    assert result.exit_code == 0, result.output
    assert "memory limit 21.00 GiB" in result.stdout
    recipe = json.loads((resumable / "recipes" / f"{STUDY}.json").read_text())
    assert recipe["measured"]["memory_limit_bytes"] == 21 * 1024**3


@pytest.mark.slow
def test_new_study_on_request(resumable):
    """--new-study starts NAME-2 with the new limit; there, no trial fits 300 MiB, so none is
    the best (where the attacker's resume named a 338.5 MiB best under a 300 MiB limit)."""
    result = search("--memory-limit", "300MiB", "--n-trials", "2", "--new-study")
    assert result.exit_code == 1 and "Error: no trial fits the memory limit; no recipe written" in result.stderr
    new = load_study(f"{STUDY}-2", None)
    # the two references ran
    assert new.user_attrs["memory_limit_bytes"] == 300 * MiB and len(new.trials) == 2
    assert not (resumable / "recipes" / f"{STUDY}-2.json").exists()
    assert len(load_study(STUDY, None).trials) == 3  # the old study is untouched


@pytest.mark.slow
def test_a_failed_warm_start_leaves_nothing_and_the_corrected_rerun_warm_starts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fake_trials(monkeypatch)
    source = tmp_path / "source"
    source.mkdir()
    monkeypatch.chdir(source)
    assert search("--n-trials", "3", "--study", "src").exit_code == 0
    monkeypatch.chdir(tmp_path)
    bad = search("--n-trials", "2", "--warm-start-from", str(source / "studies" / "nope.db"))
    assert bad.exit_code == 2 and "no such database file" in bad.stderr
    assert (
        files_under(tmp_path) == files_under(source) | {"source"} - {"studies", "recipes"}
        or not (tmp_path / "studies").exists()
    )
    assert not (tmp_path / "studies").exists() and not (tmp_path / "recipes").exists()
    good = search("--n-trials", "1", "--warm-start-from", str(source / "studies" / "src.db"))
    assert good.exit_code == 0, good.output
    warm = [t for t in load_study(STUDY, None).trials if "warm_start_from" in t.user_attrs]
    assert warm, "the corrected rerun must warm-start"


@pytest.mark.slow
def test_ctrl_c_during_study_creation_leaves_a_whole_study(tmp_path, monkeypatch):
    """A Ctrl-C while the study is being set up waits until it is set up, then stops the run:
    the next run resumes at once instead of finding a half-made study."""
    import autotune.search.run as run_module

    monkeypatch.chdir(tmp_path)
    fake_trials(monkeypatch)
    real = run_module.enqueue_references

    handlers = []  # what handled SIGINT when the user pressed it, should the test fail

    def interrupted_midway(study):
        handlers.append((signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, [])))
        # The user presses Ctrl-C in the middle of the set-up. raise_signal, not os.kill: the
        # signal is this thread's at once, wherever the kernel would have sent a process's.
        signal.raise_signal(signal.SIGINT)
        real(study)

    monkeypatch.setattr(run_module, "enqueue_references", interrupted_midway)
    result = search("--n-trials", "2")
    assert result.exit_code == 130, (result.exit_code, handlers, result.output)
    assert result.stderr == "Error: interrupted (Ctrl-C)\n"
    study = load_study(STUDY, None)
    # set up whole: the two references
    assert study.user_attrs.get("identity") and len(study.trials) == 2
    monkeypatch.setattr(run_module, "enqueue_references", real)
    waits = no_waiting_for_a_creator(monkeypatch)
    assert search("--n-trials", "1").exit_code == 0
    assert waits == []  # resumed at once: it never waited for a creator


@pytest.mark.slow
def test_a_half_made_study_of_a_dead_creator_is_set_up_at_once(tmp_path, monkeypatch):
    """A study created by a process that was then killed (kill -9) before setting it up: the
    next run sees its creator is gone and sets it up, without waiting JOIN_WAIT_S."""
    import subprocess

    monkeypatch.chdir(tmp_path)
    fake_trials(monkeypatch)
    dead = subprocess.Popen(["true"])
    dead.wait()
    url = f"sqlite:///{tmp_path / 'half.db'}"
    half = optuna.create_study(study_name="half", storage=open_storage(url), direction="maximize")
    half.set_user_attr("creator", {"host": __import__("socket").gethostname(), "pid": dead.pid})
    waits = no_waiting_for_a_creator(monkeypatch)
    result = run_search(settings(storage=url, study="half", n_trials=1))
    assert waits == []  # set up at once, not after JOIN_WAIT_S
    assert result.study.user_attrs["identity"] and result.new_study


def test_a_study_name_from_settings_is_checked():
    with pytest.raises(UsageError, match="a study name is"):
        run_search(settings(study="../x"))


def no_waiting_for_a_creator(monkeypatch) -> list[float]:
    """The sleeps of a study's join wait (study.lifecycle), counted instead of timed."""
    import autotune.study.lifecycle as study_module

    waits: list[float] = []
    monkeypatch.setattr(study_module, "_pause", waits.append)
    return waits
