"""`autotune dashboard` and optuna-dashboard: our studies are served unchanged, and
`autotune dashboard` starts the server (or says how to install it)."""

from __future__ import annotations

import io
import json
import sys

import pytest

from autotune.study.storage import load_ref
from tests.helpers import invoke

pytestmark = pytest.mark.process  # compare_studies runs two searches


def wsgi_get(app, path: str) -> tuple[str, bytes]:
    status: list[str] = []
    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": path,
        "QUERY_STRING": "",
        "SERVER_NAME": "localhost",
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "wsgi.input": io.BytesIO(b""),
        "wsgi.errors": io.StringIO(),
        "wsgi.url_scheme": "http",
    }
    body = b"".join(app(environ, lambda s, headers, exc_info=None: status.append(s)))
    return status[0], body


def test_optuna_dashboard_reads_our_studies_unchanged(studies):
    optuna_dashboard = pytest.importorskip("optuna_dashboard")
    from autotune.study.storage import open_storage

    study = load_ref(str(studies / "a.db"))
    for trial in study.trials:  # plain JSON values, as the dashboard needs them
        assert json.loads(json.dumps(trial.user_attrs)) == trial.user_attrs
    assert json.loads(json.dumps(study.user_attrs)) == study.user_attrs
    app = optuna_dashboard.wsgi(open_storage(str(studies / "a.db"), create=False))
    status, body = wsgi_get(app, "/api/studies")
    assert status.startswith("200")
    summaries = {s["study_name"]: s for s in json.loads(body)["study_summaries"]}
    status, body = wsgi_get(app, f"/api/studies/{summaries['a']['study_id']}")
    assert status.startswith("200")
    served = json.loads(body)
    assert len(served["trials"]) == len(study.trials)
    for mine, theirs in zip(study.trials, served["trials"]):
        attrs = {a["key"]: a["value"] for a in theirs["user_attrs"]}
        assert set(attrs) == set(mine.user_attrs)
        assert attrs["outcome"] == mine.user_attrs["outcome"]
        assert json.loads(attrs["config"]) == mine.user_attrs["config"]
        assert float(attrs["tokens_per_sec"]) == pytest.approx(mine.user_attrs["tokens_per_sec"])
        assert int(attrs["peak_memory_bytes"]) == mine.user_attrs["peak_memory_bytes"]
        # the dashboard shows long values cut (MAX_ATTR_LENGTH); the headline numbers are attrs of their own
        assert json.dumps(mine.user_attrs["measurement"]).startswith(attrs["measurement"])
    assert {"key": "tokens_per_sec", "sortable": True} in served["union_user_attrs"]
    assert {"key": "peak_memory_bytes", "sortable": True} in served["union_user_attrs"]


def test_dashboard_command(studies, monkeypatch):
    optuna_dashboard = pytest.importorskip("optuna_dashboard")
    calls = []
    monkeypatch.setattr(optuna_dashboard, "run_server", lambda storage, **kw: calls.append((storage, kw)))
    result = invoke("dashboard", "--study", "a", "--storage", str(studies / "a.db"), "--port", "8123")
    assert result.exit_code == 0, result.output
    assert calls and calls[0][1] == {"host": "127.0.0.1", "port": 8123}
    assert "http://127.0.0.1:8123/dashboard/studies/" in result.output

    monkeypatch.setitem(sys.modules, "optuna_dashboard", None)  # as if not installed
    result = invoke("dashboard", "--study", "a", "--storage", str(studies / "a.db"))
    assert result.exit_code == 1 and "pip install optuna-dashboard" in result.output


@pytest.mark.parametrize("sig, code, said", [(2, 130, "interrupted (Ctrl-C)"), (15, 143, "stopped by SIGTERM")])
def test_the_dashboard_stopped_by_ctrl_c_or_sigterm_exits_130_or_143(tmp_path, sig, code, said):
    """bottle's server swallows the KeyboardInterrupt: `dashboard` exited 0 although it says 130."""
    import socket

    pytest.importorskip("optuna_dashboard")
    from autotune.study.storage import open_storage
    from tests.helpers import autotune_cmd, start_process, synthetic_study, wait_for

    synthetic_study(open_storage(f"{tmp_path}/s.journal"), n=3)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = start_process(
        autotune_cmd("dashboard", "--storage", f"{tmp_path}/s.journal", "--port", str(port)), cwd=tmp_path
    )

    def listening() -> bool:
        with socket.socket() as client:
            return client.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_for(listening, 120, "the dashboard to listen")
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == code, err
    assert err.strip().splitlines()[-1] == f"Error: {said}", err
