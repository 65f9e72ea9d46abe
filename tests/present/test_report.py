"""autotune.present.report and `autotune report`: the Markdown report with its charts, of
a real study and of a synthetic GPU study with every outcome."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from autotune.present.text import shown_config
from autotune.study.storage import load_ref, open_storage
from autotune.study.summary import summarize
from tests.helpers import invoke, synthetic_study


def check_images(out: Path) -> None:
    import matplotlib.image
    import numpy as np

    md = (out / "report.md").read_text()
    for name in ("history", "memory", "importance", "knobs"):
        path = out / f"{name}.png"
        pixels = matplotlib.image.imread(path)
        height, width = pixels.shape[:2]
        assert width >= 400 and height >= 300, (name, width, height)
        assert float(np.std(pixels)) > 0, name
        assert f"![{name}]({name}.png)" in md


@pytest.mark.process
def test_report_of_a_real_study(studies, tmp_path):
    out = tmp_path / "report-a"
    result = invoke("report", "--study", "a", "--storage", str(studies / "a.db"), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert f"open {out / 'report.md'}" in result.output
    check_images(out)
    md = (out / "report.md").read_text()
    best = summarize(load_ref(str(studies / "a.db"))).best
    assert f"## Best configuration (trial #{best.number})" in md
    for knob in shown_config(best.config):  # one process: no multi-rank knob (issue D, #8)
        assert f"\n| {knob} | " in md
    assert "| parallelism |" not in md and "parallelism" in best.config
    assert "## Outcomes" in md and "autotune dashboard --study a" in md


@pytest.mark.slow
def test_report_of_every_outcome(tmp_path):
    # A journal file: its 30 trials are written in milliseconds, where SQLite takes seconds (the
    # report of an SQLite study is the one above).
    synthetic_study(open_storage(f"{tmp_path}/h200.journal"), n=30)  # 22 searched: enough to rank the knobs
    out = tmp_path / "reports" / "h200"
    result = invoke("report", "--storage", str(tmp_path / "h200.journal"), "--out", str(out))
    assert result.exit_code == 0, result.output
    check_images(out)
    md = (out / "report.md").read_text()
    for outcome in ("ok", "oom", "over_memory_limit", "unsupported"):
        assert f"\n| {outcome} | " in md
    assert "Knob importance (" in md and re.search(r"\| \d+% \(90%: \d+-\d+%\) \|", md)


@pytest.mark.process
def test_report_of_an_unknown_study(studies, tmp_path):
    result = invoke("report", "--study", "zzz", "--storage", str(studies / "a.db"), "--out", str(tmp_path / "r"))
    assert result.exit_code == 2 and "no study 'zzz'" in result.output


@pytest.mark.slow
def test_report_never_writes_through_a_link_nor_over_a_folder(tmp_path):
    """`report --out DIR` with DIR/report.md a symlink wrote through it and overwrote the
    target; DIR/history.png a folder, or DIR a file, gave a traceback or exit 1."""
    storage = tmp_path / "h200.journal"
    synthetic_study(open_storage(str(storage)), n=6)
    out = tmp_path / "out"
    out.mkdir()
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    (out / "report.md").symlink_to(precious)
    result = invoke("report", "--storage", str(storage), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert precious.read_text() == "keep me"  # the link itself was replaced
    assert not (out / "report.md").is_symlink() and "# autotune report" in (out / "report.md").read_text()
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary file left

    second = tmp_path / "second"
    (second / "history.png").mkdir(parents=True)
    (second / "history.png" / "mine").write_text("mine")
    result = invoke("report", "--storage", str(storage), "--out", str(second))
    assert result.exit_code == 2, result.output
    assert "history.png" in result.output and "folder" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert sorted(p.name for p in second.iterdir()) == ["history.png"]
    assert (second / "history.png" / "mine").read_text() == "mine"

    a_file = tmp_path / "a-file"
    a_file.write_text("mine")
    result = invoke("report", "--storage", str(storage), "--out", str(a_file))
    assert result.exit_code == 2 and "not a folder" in result.output, result.output
    assert a_file.read_text() == "mine"


@pytest.mark.slow
def test_report_refuses_a_study_name_that_is_a_path(tmp_path, monkeypatch):
    """Issue D, R06: a handed-over database whose study is named `../../x` or an absolute path
    made `report` (with or without --study) write its default reports/<study> outside reports/.
    The name is refused as export and search refuse it, in one line, and nothing is written."""
    here = tmp_path / "a" / "b" / "work"
    here.mkdir(parents=True)
    monkeypatch.chdir(here)
    outside = tmp_path / "abs"
    for name, lands in (("../../x", here.parent / "x"), (str(outside), outside)):
        db = tmp_path / f"handed-over-{len(name)}.db"
        synthetic_study(f"sqlite:///{db}", name=name, n=4)
        for study in ([], ["--study", name]):
            result = invoke("report", *study, "--storage", str(db))
            assert result.exit_code == 2, result.output
            assert "a study name is letters, digits and . _ -" in result.output
            assert len(result.output.strip().splitlines()) == 1
            assert not lands.exists() and sorted(p.name for p in here.iterdir()) == []
        # With --out the user names the folder: the study's name names no file.
        result = invoke("report", "--storage", str(db), "--out", str(here / "mine"))
        assert result.exit_code == 0, result.output
        assert not lands.exists() and (here / "mine" / "report.md").is_file()
        shutil.rmtree(here / "mine")
