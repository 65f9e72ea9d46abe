"""cpu_threads, the threads a step on the CPU runs on (issue D, #2: PyTorch's default, a thread
per core, ran 9.3x slower than one thread on a busy host, and no search could find that out):
searched on a CPU, applied in a trial process and in a running one, refused where it cannot
mean anything, recorded in the recipe and said in each export."""

from __future__ import annotations

import pytest
import torch

from autotune.config import RunSpec, TrainConfig, accumulation_for
from autotune.device.info import usable_cpus
from autotune.errors import UnsupportedConfig
from autotune.knobs.apply import apply_model_knobs
from autotune.knobs.process import process_env
from autotune.knobs.support import DeviceCapabilities, check_supported
from autotune.model.load import build_model
from autotune.space.file import default_space_path, load_space


def test_a_trial_process_starts_with_the_threads_and_zero_leaves_them_alone():
    assert process_env(TrainConfig(cpu_threads=2), {})["OMP_NUM_THREADS"] == "2"
    assert "OMP_NUM_THREADS" not in process_env(TrainConfig(), {"OMP_NUM_THREADS": "3"})


def test_a_running_process_takes_the_threads_when_the_model_is_prepared():
    before = torch.get_num_threads()
    try:
        apply_model_knobs(build_model("gpt2-tiny"), TrainConfig(cpu_threads=1))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_it_is_refused_where_it_cannot_mean_anything():
    with pytest.raises(UnsupportedConfig, match="a GPU's step runs on the GPU"):
        check_supported(TrainConfig(cpu_threads=2), DeviceCapabilities.detect("cuda", (9, 0)))
    with pytest.raises(UnsupportedConfig, match="its share of the CPUs"):
        accumulation_for(None, TrainConfig(cpu_threads=1, parallelism="ddp"), world_size=2)
    with pytest.raises(UnsupportedConfig, match=f"more than the {usable_cpus()} CPUs"):
        accumulation_for(None, TrainConfig(cpu_threads=usable_cpus() + 1))


def test_the_cpu_space_searches_it():
    space = load_space(default_space_path("cpu"), n_layer=2, seq_len=128)
    assert 0 in space.dimensions["cpu_threads"].choices and 1 in space.dimensions["cpu_threads"].choices


def test_the_recipe_carries_it_to_the_users_environment_and_each_export_says_it():
    from autotune.integrations import hf
    from autotune.recipe.recipe import Recipe

    recipe = Recipe(config=TrainConfig(cpu_threads=1), hardware={"kind": "cpu"})
    assert recipe.environment() == {"OMP_NUM_THREADS": "1"}
    args = hf.training_arguments(recipe, check=False)
    assert any("OMP_NUM_THREADS=1" in note for note in hf.notes(recipe, args))


@pytest.mark.slow
def test_a_trial_runs_its_steps_on_the_threads(tmp_path, monkeypatch):
    from autotune.trial.runner import run_trial

    record = tmp_path / "threads"
    monkeypatch.setenv("AUTOTUNE_TEST_BUILDS", str(record))
    monkeypatch.chdir(tmp_path)
    spec = RunSpec(model="tests.fault_models:threads_reporter", warmup=1, steps=2, min_time_s=0)
    for threads in (1, 2):
        cfg = TrainConfig(token_budget=1024, batching="fixed", cpu_threads=threads)  # one shape to warm up
        result = run_trial(spec, cfg, timeout_s=120)
        assert result.outcome == "ok", result.reason
        assert set(record.read_text().split()) == {str(threads)}
        record.unlink()
