"""Storage URLs are parsed strictly (issue 14, item 2): a typo is refused in one line, never a
SQLite file named after the URL; passwords are hidden through SQLAlchemy's parser, whatever
the URL's shape; a storage file's folder is never created (except the default studies/);
study names are plain names. Also the in-memory SQLite storage without heartbeat noise."""

from __future__ import annotations

import pytest

from autotune.errors import UsageError
from autotune.study.storage import open_storage
from autotune.study.urls import redact
from tests.attack_helpers import FAST, fake_trials, refused, settings
from tests.helpers import FINISHED

# --- the attacker's reproductions --------------------------------------------------------------


def test_a_one_slash_postgres_url_is_refused_and_its_password_never_shown(tmp_path, monkeypatch):
    message = refused(tmp_path, monkeypatch, "search", *FAST, "--storage", "postgresql:/u:secretpw@host/db")
    assert "secretpw" not in message and "not a valid URL" in message


def test_a_bare_word_is_not_a_sqlite_file(tmp_path, monkeypatch):
    message = refused(tmp_path, monkeypatch, "search", *FAST, "--storage", "notaurl")
    assert "'notaurl': not a storage; expected sqlite:///PATH.db, journal:PATH" in message


def test_a_journal_in_a_missing_folder_creates_no_folder(tmp_path, monkeypatch):
    missing = tmp_path / "nonexistent" / "dir"
    message = refused(tmp_path, monkeypatch, "search", *FAST, "--storage", f"journal:{missing}/x.journal")
    assert f"the folder {missing} does not exist; create it first" in message
    assert not (tmp_path / "nonexistent").exists()


@pytest.mark.parametrize("name", ["../../x", "a/b", ".hidden", "-x", "x" * 200, "a b", ""])
def test_study_names_are_plain_names(tmp_path, monkeypatch, name):
    message = refused(tmp_path, monkeypatch, "search", *FAST, "--study", name)
    assert "a study name is letters, digits and . _ -" in message
    assert not (tmp_path.parent / "x.db").exists() and not (tmp_path.parent.parent / "x.json").exists()


def test_show_with_a_path_for_a_study_name_is_refused(tmp_path, monkeypatch):
    assert "a study name is" in refused(tmp_path, monkeypatch, "show", "--study", "../../etc/x")


def test_a_raw_at_in_a_password_is_refused_and_hidden_whole():
    from autotune.study.urls import parse_storage_url

    url = "postgresql://tuner:p@ss@w0rd@db.example/autotune"
    with pytest.raises(UsageError) as info:
        parse_storage_url(url)
    message = str(info.value)
    assert "%40" in message
    for part in ("p@ss", "ss@w0rd", "w0rd", "@ss"):
        assert part not in message
    assert "w0rd" not in redact(url) and "ss" not in redact(url).split("//", 1)[1].split("db.example")[0]


# --- what is accepted, and how it is shown ----------------------------------------------------------


@pytest.mark.parametrize(
    "text, kind, url",
    [
        ("sqlite:///studies/x.db", "sqlite", "sqlite:///studies/x.db"),
        ("sqlite:////abs/x.db", "sqlite", "sqlite:////abs/x.db"),
        ("studies/x.db", "sqlite", "sqlite:///studies/x.db"),
        ("x.journal", "journal", "journal:x.journal"),
        ("journal:studies/x.journal", "journal", "journal:studies/x.journal"),
        ("postgresql://tuner:pw@db/autotune", "rdb", "postgresql://tuner:pw@db/autotune"),
        ("postgresql+psycopg2://tuner@db:5432/autotune", "rdb", "postgresql+psycopg2://tuner@db:5432/autotune"),
        ("mysql://u:pw@h/d", "rdb", "mysql://u:pw@h/d"),
        ("sqlite://", "sqlite", "sqlite://"),
        ("./a:b.db", "sqlite", "sqlite:///./a:b.db"),
    ],
)
def test_accepted_forms(text, kind, url):
    from autotune.study.urls import parse_storage_url

    parsed = parse_storage_url(text)
    assert (parsed.kind, parsed.url) == (kind, url)


@pytest.mark.parametrize(
    "text",
    [
        "notaurl",
        "postgresql:/u:pw@h/d",
        "postgres:u:pw@h/d",
        "http://example.com/x.db",
        "oracle://u:pw@h/d",
        "sqlite:/x.db",
        "sqlite://x.db",
        "journal:",
        "postgresql://u:pw@/d",
        "postgresql://u:pw@h",
        "x.sqlite",
        "a:b.db",
        "study.db\n",
    ],
)
def test_refused_forms(text):
    from autotune.study.urls import parse_storage_url

    with pytest.raises(UsageError) as info:
        parse_storage_url(text)
    assert "pw" not in str(info.value).replace("pwd", "")


def test_redaction_goes_through_sqlalchemy():
    assert redact("postgresql://tuner:secret@db/autotune") == "postgresql://tuner:***@db/autotune"
    assert redact("postgresql+psycopg2://u:p/w:x@h:5/d") == "postgresql+psycopg2://u:***@h:5/d"
    assert redact("postgresql://u:p%40ss@h/d") == "postgresql://u:***@h/d"
    assert redact("postgresql://u@h/d?sslmode=require&password=secret") == (
        "postgresql://u@h/d?sslmode=require&password=***"
    )
    assert redact("postgresql://u:secret@h/d#study") == "postgresql://u:***@h/d#study"
    assert redact("journal:studies/x@y.journal") == "journal:studies/x@y.journal"  # a file has no password
    assert "secretpw" not in redact("postgresql:/u:secretpw@host/db")


def test_the_default_studies_folder_is_made_others_are_not(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    open_storage("sqlite:///studies/x.db")
    assert (tmp_path / "studies" / "x.db").exists()
    with pytest.raises(UsageError, match="does not exist; create it first"):
        open_storage(f"sqlite:///{tmp_path}/deep/er/x.db")
    assert not (tmp_path / "deep").exists()


@pytest.mark.slow
def test_in_memory_sqlite_runs_without_heartbeat_noise(tmp_path, monkeypatch, capfd):
    """`search --storage sqlite://` printed a heartbeat traceback per beat: an in-memory
    database is one per connection, and the heartbeat thread's has no tables."""
    import threading

    from autotune.search.run import run_search

    failures = []
    monkeypatch.setattr(threading, "excepthook", lambda args: failures.append(args.exc_value))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AUTOTUNE_HEARTBEAT_S", "1")  # the shortest interval it takes (whole seconds)
    # Optuna beats as a trial starts, then once an interval: a trial of 1.2 s beats twice.
    fake_trials(monkeypatch, delay_s=1.2)
    result = run_search(settings(storage="sqlite://", n_trials=1))
    assert len(result.study.get_trials(states=FINISHED)) == 1
    assert failures == []
    assert "Traceback" not in capfd.readouterr().err


def test_check_study_name_accepts_the_default_names():
    from autotune.study.urls import check_study_name

    for name in ("gpt2-nvidia-h200", "gpt2-tiny-cpu", "make_llama-cpu", "a.b_c-2"):
        assert check_study_name(name) == name


def test_a_raw_hash_in_a_query_password_is_not_shown_as_a_study_name():
    # Found by tests/test_fuzz.py: '#' starts a study name in a REF, so "PW#QX" read as the
    # password PW and a study QX, and QX (the password's end) was shown.
    from autotune.study.urls import redact

    assert redact("postgresql://u@h/db?sslmode=require&password=PW#QX") == (
        "postgresql://u@h/db?sslmode=require&password=***#***"
    )
