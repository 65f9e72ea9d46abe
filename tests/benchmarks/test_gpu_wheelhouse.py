"""benchmarks/gpu_wheelhouse.py: the wheels the GPU machine lacks, for its Python (3.12), complete."""

from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_wheelhouse  # noqa: E402

GPU_WHEELHOUSE = ROOT / ".wheelhouse"  # .ci/run builds it, as a session lent a GPU does


def fake_wheel(folder: Path, filename: str, *requires: str) -> None:
    name, version = filename.split("-")[:2]
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    with zipfile.ZipFile(folder / filename, "w") as archive:
        archive.writestr(f"{name}-{version}.dist-info/METADATA", metadata)


def test_a_missing_requirement_and_a_wheel_of_another_python_make_it_incomplete(tmp_path):
    fake_wheel(tmp_path, "optuna-5.0.0-py3-none-any.whl", "alembic>=1.5.0", "sqlalchemy>=1.4.2", "numpy")
    fake_wheel(tmp_path, "sqlalchemy-2.1.9-cp311-cp311-manylinux2014_x86_64.whl", "typing-extensions>=4.6.0")
    fake_wheel(tmp_path, "colorlog-6.12.0-py3-none-any.whl", 'colorama; sys_platform == "win32"')
    have = {"numpy", "typing-extensions"}
    assert gpu_wheelhouse.unmet(tmp_path, have, "3.12") == [
        "optuna-5.0.0-py3-none-any.whl requires alembic>=1.5.0, which is neither on the machine nor in the wheelhouse",
        # what pip downloads for this machine's own Python 3.11: the GPU machine refuses it
        "sqlalchemy-2.1.9-cp311-cp311-manylinux2014_x86_64.whl: not installable on CPython 3.12, Linux x86-64",
    ]
    (tmp_path / "sqlalchemy-2.1.9-cp311-cp311-manylinux2014_x86_64.whl").unlink()
    fake_wheel(tmp_path, "sqlalchemy-2.1.9-cp312-cp312-manylinux_2_17_x86_64.whl", "typing-extensions>=4.6.0")
    fake_wheel(tmp_path, "alembic-1.20.1-py3-none-any.whl", "SQLAlchemy>=2.0", 'tomli; python_version < "3.11"')
    assert gpu_wheelhouse.unmet(tmp_path, have, "3.12") == []


def test_what_the_gpu_machine_lacks_of_autotunes_own_dependencies():
    have = gpu_wheelhouse.device_packages()
    assert {"torch", "click", "pyyaml", "numpy", "nvidia-ml-py", "matplotlib"} <= have
    first = [spec.split("==")[0] for spec, _ in gpu_wheelhouse.build(Path("/nonexistent"), "3.12", have, dry=True)]
    assert first == ["optuna", "sqlalchemy"]


@pytest.mark.skipif(not GPU_WHEELHOUSE.is_dir() and not os.environ.get("CI"), reason=".ci/run builds .wheelhouse")
def test_the_gpu_machines_wheelhouse_is_complete_for_python_3_12():
    assert gpu_wheelhouse.unmet(GPU_WHEELHOUSE, gpu_wheelhouse.device_packages(), "3.12") == []
    names = {gpu_wheelhouse.wheel_name(w) for w in GPU_WHEELHOUSE.glob("*.whl")}
    assert names == {"optuna", "sqlalchemy", "alembic", "colorlog", "mako"}
