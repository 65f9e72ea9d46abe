"""A torn last record in a journal file (issue 14, item 1): kill -9 or a full disk mid-append.
The study is read up to its last whole record, the torn bytes are kept aside as a backup, the
user is told, and appending afterwards keeps the file readable (it used to glue the next
record to the torn one, after which even `show` failed and every trial was lost)."""

from __future__ import annotations

import logging

import optuna
from click.testing import CliRunner

from autotune.cli import main
from autotune.search.run import run_search
from autotune.study.storage import open_storage
from tests.attack_helpers import fake_trials, settings

optuna.logging.set_verbosity(optuna.logging.WARNING)


def tear_last_record(path) -> bytes:
    """Cut the file's last record in half, as a writer killed mid-write leaves it; returns the
    whole record as it was."""
    data = path.read_bytes()
    last = data.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    path.write_bytes(data[: len(data) - 1 - len(last) // 2])
    return last


def make_study(tmp_path, monkeypatch, n_trials: int = 3):
    monkeypatch.chdir(tmp_path)
    fake_trials(monkeypatch)
    url = f"journal:{tmp_path / 'j.journal'}"
    run_search(settings(storage=url, study="s", n_trials=n_trials))
    return url, tmp_path / "j.journal"


def test_search_on_a_torn_journal_resumes_and_show_still_reads_it(tmp_path, monkeypatch, caplog):
    """The attacker's reproduction: tear the last record, `search` again, then `show`."""
    url, path = make_study(tmp_path, monkeypatch)
    last = tear_last_record(path)
    with caplog.at_level(logging.WARNING):
        result = CliRunner().invoke(
            main,
            [
                "search",
                "--model",
                "gpt2-tiny",
                "--device",
                "cpu",
                "--space",
                settings().space,
                "--steps",
                "4",
                "--warmup",
                "1",
                "--min-time",
                "0",
                "--storage",
                url,
                "--study",
                "s",
                "--n-trials",
                "2",
            ],
        )
    assert result.exit_code == 0, (result.output, result.exception)
    assert "cut short" in caplog.text and "set aside in j.journal.torn-" in caplog.text
    backups = list(tmp_path.glob("j.journal.torn-*"))
    assert len(backups) == 1 and last.startswith(backups[0].read_bytes())  # the torn half, kept
    assert path.read_bytes().endswith(b"\n")
    shown = CliRunner().invoke(main, ["show", "--storage", url, "--study", "s", "--json"])
    assert shown.exit_code == 0, shown.output
    study = optuna.load_study(study_name="s", storage=open_storage(url, create=False))
    assert len(study.trials) == 5  # 3, then 2 more: nothing lost but the torn record itself


def test_a_journal_glued_by_an_older_autotune_is_repaired(tmp_path, monkeypatch, caplog):
    """A file in the state the old code left: a whole record appended to the torn one."""
    url, path = make_study(tmp_path, monkeypatch, n_trials=2)
    tear_last_record(path)
    # What the old code did next: append through Optuna's backend, gluing the records.
    from optuna.storages.journal import JournalFileBackend

    JournalFileBackend(str(path)).append_logs(
        [{"op_code": 0, "worker_id": "x", "study_name": "other", "directions": [1]}]
    )
    with caplog.at_level(logging.WARNING):
        storage = open_storage(url)
    assert "set aside" in caplog.text
    names = sorted(s.study_name for s in storage.get_all_studies())
    assert names == ["other", "s"]


def test_reading_a_torn_journal_changes_nothing(tmp_path, monkeypatch, caplog):
    url, path = make_study(tmp_path, monkeypatch, n_trials=2)
    tear_last_record(path)
    before = path.read_bytes()
    with caplog.at_level(logging.WARNING):
        open_storage(url, create=False)
    assert path.read_bytes() == before and not list(tmp_path.glob("*.torn-*"))
    assert "cut short" in caplog.text


def test_a_journal_line_that_is_no_record_is_refused_not_guessed(tmp_path, monkeypatch):
    from autotune.errors import UsageError

    url, path = make_study(tmp_path, monkeypatch, n_trials=2)
    lines = path.read_bytes().split(b"\n")
    lines[1] = b"garbage that is no record"
    path.write_bytes(b"\n".join(lines))
    before = path.read_bytes()
    try:
        open_storage(url)
    except UsageError as exc:
        assert "line 2 is not a journal record" in str(exc)
    else:
        raise AssertionError("a corrupt middle line must be refused")
    assert path.read_bytes() == before


def test_a_file_with_no_journal_record_is_refused_and_left_untouched(tmp_path, monkeypatch):
    """`--storage journal:config.json` on a file that is no journal (one line, no record at all):
    its content was moved aside as a "torn record" and the file made a journal. Refused now."""
    monkeypatch.chdir(tmp_path)
    for content in (b'{"lr": 0.1}', b'{"lr": 0.1}\n', b"plain text\nmore text\n"):
        path = tmp_path / "config.json"
        path.write_bytes(content)
        result = CliRunner().invoke(main, ["show", "--storage", f"journal:{path}", "--study", "s"])
        assert result.exit_code == 2, result.output
        assert "is not a journal file" in result.output and len(result.output.strip().splitlines()) == 1
        try:
            open_storage(f"journal:{path}")
        except Exception as exc:
            assert "is not a journal file" in str(exc)
        else:
            raise AssertionError("a file that holds no journal record must be refused")
        assert path.read_bytes() == content
        assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]
