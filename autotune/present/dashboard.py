"""`autotune dashboard`: a study in optuna-dashboard, served on 127.0.0.1."""

from __future__ import annotations

import optuna

from autotune.errors import AutotuneError
from autotune.study.storage import internals


def require_dashboard():
    """The optuna_dashboard module, or AutotuneError (exit 1) saying how to install it."""
    try:
        import optuna_dashboard
    except ImportError:
        raise AutotuneError("the dashboard needs optuna-dashboard: pip install optuna-dashboard") from None
    return optuna_dashboard


def serve_dashboard(study: optuna.Study, port: int) -> None:
    """optuna-dashboard on 127.0.0.1:`port` over the study's storage, until Ctrl-C.
    Our user attrs are plain JSON values, so it shows them as they are."""
    storage, _ = internals(study)
    require_dashboard().run_server(storage, host="127.0.0.1", port=port)


def dashboard_url(study: optuna.Study, port: int) -> str:
    _, study_id = internals(study)
    return f"http://127.0.0.1:{port}/dashboard/studies/{study_id}"
