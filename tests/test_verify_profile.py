"""`autotune verify` and `autotune profile` on a recipe measured here, on CPU, and the
example training script. The CPU is shared and noisy: tolerances are generous and the
failing recipe claims far more than any run could reach."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from torch.autograd import DeviceType

from autotune.cli import main
from autotune.config import RunSpec, TrainConfig
from autotune.errors import UsageError
from autotune.device import software_versions
from autotune.measure.loop import measure
from autotune.measure.profile import CATEGORIES, _shares, attribute, classify_op
from autotune.recipe.profile import profile_recipe
from autotune.recipe.recipe import Recipe, now_iso, recipe_measured
from autotune.units import parse_fraction

ROOT = Path(__file__).resolve().parent.parent
FAST = ["--device", "cpu", "--steps", "6", "--warmup", "1"]


@pytest.fixture(scope="module")
def recipe() -> Recipe:
    """gpt2-tiny measured once on this CPU, made into a recipe as search would."""
    cfg = TrainConfig(token_budget=1024)
    m = measure(RunSpec(model="gpt2-tiny", device="cpu", warmup=1, steps=6), cfg)
    assert m.outcome == "ok", m.reason
    return Recipe(config=cfg, model={**m.model, "name": "gpt2-tiny"}, data="synthetic",
                  measured=recipe_measured(m, None), hardware=m.device, software=software_versions(),
                  study={"name": "test", "trial": 0}, created=now_iso())


def save(recipe: Recipe, path: Path, **measured) -> Path:
    copy = Recipe.from_dict(recipe.to_dict())
    copy.measured.update(measured)
    return copy.save(path)


def test_verify_passes_within_a_generous_tolerance(recipe, tmp_path):
    elsewhere = Recipe.from_dict(recipe.to_dict())
    elsewhere.hardware["name"] = "Imaginary CPU 9000"
    path = elsewhere.save(tmp_path / "r.json")
    result = CliRunner().invoke(main, ["verify", str(path), "--tolerance", "99%", *FAST])
    assert result.exit_code == 0, result.output
    assert "PASS" in result.stdout
    assert "tokens/s" in result.stdout and "peak memory" in result.stdout and "ratio" in result.stdout
    # Measured on other hardware: one line on stderr, not a Python warning's two.
    warning_lines = result.stderr.strip().splitlines()
    assert len(warning_lines) == 1 and warning_lines[0].startswith("Warning: this recipe was measured elsewhere")
    assert "Imaginary CPU 9000" in warning_lines[0]


def test_verify_fails_when_the_record_is_out_of_reach(recipe, tmp_path):
    # 1000x, not 10x: a run on this shared CPU can be 10x slower or faster than another.
    path = save(recipe, tmp_path / "r.json", tokens_per_sec=1000 * recipe.measured["tokens_per_sec"])
    result = CliRunner().invoke(main, ["verify", str(path), "--json", *FAST])
    assert result.exit_code == 1, result.output
    assert "measured elsewhere" not in result.stderr  # measured here
    data = json.loads(result.stdout)
    assert set(data) == {"recorded", "measured", "ratio_tokens_per_sec", "ratio_peak_memory", "tolerance",
                         "passed", "outcome", "reason"}
    assert data["passed"] is False and data["outcome"] == "ok"
    assert data["tolerance"] == pytest.approx(0.15)  # the CPU default: its runs spread more than a GPU's
    assert "below the 0.85x allowed" in data["reason"]
    assert data["ratio_tokens_per_sec"] == pytest.approx(
        data["measured"]["tokens_per_sec"] / data["recorded"]["tokens_per_sec"])
    assert data["ratio_peak_memory"] > 0 and data["measured"]["peak_memory_bytes"] > 0


def test_default_tolerance_is_tighter_on_a_gpu():
    from autotune.recipe.verify import default_tolerance

    assert default_tolerance("cuda") == default_tolerance("cuda:1") == pytest.approx(0.05)
    assert default_tolerance("cpu") == pytest.approx(0.15)


@pytest.mark.parametrize("text,value", [("5%", 0.05), ("0.05", 0.05), ("12.5%", 0.125), ("0", 0.0)])
def test_parse_tolerance(text, value):
    assert parse_fraction(text, option="--tolerance") == pytest.approx(value)


@pytest.mark.parametrize("bad", ["abc", "150%", "1.5", "-5%"])
def test_bad_tolerance_exits_2_naming_the_option(recipe, tmp_path, bad):
    with pytest.raises(UsageError):
        parse_fraction(bad, option="--tolerance")
    result = CliRunner().invoke(main, ["verify", str(save(recipe, tmp_path / "r.json")), "--tolerance", bad])
    assert result.exit_code == 2
    assert "--tolerance" in result.output


def test_profile_prints_the_breakdown_and_writes_a_trace(recipe, tmp_path):
    out = tmp_path / "prof"
    result = CliRunner().invoke(main, ["profile", str(save(recipe, tmp_path / "r.json")), "--device", "cpu",
                                       "--steps", "3", "--warmup", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    for label in ("data wait", "attention (SDPA)", "matmuls", "elementwise / norm", "optimizer", "other",
                  "top operators by self CPU time", "trace.json"):
        assert label in result.stdout
    trace = json.loads((out / "trace.json").read_text())
    names = {str(e.get("name")) for e in trace["traceEvents"]}
    assert any("scaled_dot_product" in n for n in names) and "aten::mm" in names
    assert {"autotune:data_wait", "autotune:optimizer"} <= names


def test_profile_report_figures(recipe, tmp_path):
    report = profile_recipe(recipe, device="cpu", steps=2, warmup=1, out_dir=tmp_path)
    assert set(report.shares) == set(CATEGORIES)
    assert sum(report.shares.values()) == pytest.approx(1.0)
    for category in ("attention", "matmul", "elementwise", "optimizer"):
        assert report.shares[category] > 0, category
    assert report.time_basis == "self CPU time"
    assert report.top_ops and report.top_ops[0].self_time_s >= report.top_ops[-1].self_time_s
    assert report.tokens > 0 and Path(report.trace_path).is_file()
    json.dumps(report.to_dict())


@pytest.mark.parametrize("name,category", [
    ("aten::addmm", "matmul"), ("autograd::engine::evaluate_function: MmBackward0", "matmul"),
    ("aten::_scaled_dot_product_flash_attention_backward", "attention"),
    ("aten::native_layer_norm_backward", "elementwise"), ("aten::gelu", "elementwise"), ("aten::copy_", "elementwise"),
    ("aten::_fused_adamw_", "optimizer"), ("aten::_foreach_mul_", "optimizer"),
    ("triton_poi_fused_add_native_layer_norm_0", "elementwise"), ("triton_tem_fused_mm_1", "matmul"),
    ("aten::embedding_dense_backward", "other"), ("aten::expand", "other"),
])
def test_classify_op(name, category):
    assert classify_op(name) == category


class FakeEvent:
    """What `attribute` reads of a profiler FunctionEvent (times in microseconds)."""

    def __init__(self, name, *, parent=None, cpu=0.0, device=0.0, cpu_total=None, device_type=DeviceType.CPU):
        self.name, self.cpu_parent, self.device_type, self.is_async = name, parent, device_type, False
        self.self_cpu_time_total, self.self_device_time_total = cpu, device
        self.cpu_time_total = cpu if cpu_total is None else cpu_total


def test_attribution_with_device_time():
    """The CUDA rules, without a GPU: kernel time is the launching op's self device time,
    data wait is the region's host time, regions and SDPA claim their children."""
    wait = FakeEvent("autotune:data_wait", cpu=900, cpu_total=1000)
    opt = FakeEvent("autotune:optimizer", cpu=50, device=0)
    sdpa = FakeEvent("aten::scaled_dot_product_attention", cpu=5, device=0)
    events = [
        wait, FakeEvent("aten::copy_", parent=wait, cpu=100, device=7),  # inside the wait: host time only
        opt, FakeEvent("aten::_fused_adamw_", parent=opt, cpu=10, device=300),
        FakeEvent("aten::copy_", parent=opt, cpu=1, device=20),
        sdpa, FakeEvent("aten::_scaled_dot_product_flash_attention", parent=sdpa, cpu=5, device=400),
        FakeEvent("aten::mm", cpu=20, device=2000),
        FakeEvent("aten::native_layer_norm", cpu=10, device=100),
        FakeEvent("aten::copy_", cpu=3, device=80),
        FakeEvent("void gemm_kernel<...>", device=2000, device_type=DeviceType.CUDA),  # counted on aten::mm
    ]
    seconds, ops = attribute(events, device_time=True)
    assert seconds == pytest.approx({"data_wait": 1000e-6, "attention": 400e-6, "matmul": 2000e-6,
                                     "elementwise": 180e-6, "optimizer": 320e-6, "other": 0.0})
    assert ops["aten::copy_", "optimizer"] == [pytest.approx(20e-6), 1]
    assert ops["aten::copy_", "elementwise"] == [pytest.approx(80e-6), 1]
    shares, filled = _shares(seconds, wall=0.005)
    assert filled["other"] == pytest.approx(0.005 - 3900e-6)  # idle device and overhead
    assert sum(shares.values()) == pytest.approx(1.0)


def test_example_script_trains_on_cpu(recipe, tmp_path):
    path = save(recipe, tmp_path / "r.json")
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "train_gpt2.py"), "--steps", "3",
                           "--recipe", str(path), "--device", "cpu"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    steps = [line for line in proc.stdout.splitlines() if line.startswith("step")]
    assert len(steps) == 3 and all("loss" in line for line in steps)
