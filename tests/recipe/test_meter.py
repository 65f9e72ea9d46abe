"""The meter in a user's own loop (autotune/recipe/meter.py): gpt2-tiny steps on the CPU, each
test planting one cause of a short run and reading the verdict name it, one run that matches
its recipe, and on a strict fake of CUDA, no synchronize per step."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from autotune.config import TrainConfig
from autotune.model.load import build_model
from autotune.recipe import Recipe
from autotune.recipe.meter import RunMeter
from autotune.recipe.recipe import RECIPE_FIGURES
from autotune.recipe.run_verdict import MEMORY_MARGIN


@pytest.fixture(autouse=True)
def _the_loop_alone(monkeypatch):
    """The meter reads the process tree's RSS (a user's DataLoader workers are the loop's); here
    the tree would also hold whatever a session fixture runs in the background of this xdist
    worker (a search, the GPU check's dry run), coming and going between a test's two runs."""
    import autotune.device.memory

    monkeypatch.setattr(autotune.device.memory, "descendants", lambda pid: [])


ROOT = Path(__file__).resolve().parents[2]
STEPS = 10  # two of warm-up, eight measured: ~0.5 s of gpt2-tiny on this CPU
PACKED = TrainConfig(token_budget=256, batching="packed")


def documents(count: int = 120, low: int = 100, high: int = 130, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, int(n)).tolist() for n in rng.integers(low, high, count)]


def recipe_of(config: TrainConfig = PACKED, measured: dict | None = None) -> Recipe:
    return Recipe(config=config, model={"name": "gpt2-tiny"}, measured=measured or {}, hardware={"kind": "cpu"})


def train(
    recipe: Recipe,
    model: torch.nn.Module,
    batches,
    *,
    steps: int = STEPS,
    autocast: bool = True,
    during_step=lambda: None,
) -> RunMeter:
    """A user's loop: forward under the recipe's autocast, backward, AdamW; the meter around
    the batches, as the README's loop has it."""
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    meter = recipe.meter(model)
    for batch in meter.batches(itertools.islice(batches, steps)):
        with recipe.autocast("cpu") if autocast else contextlib.nullcontext():
            output = model(**batch)
        getattr(output, "loss", output).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        during_step()
    meter.close()
    return meter


def recorded_by(meter: RunMeter, config: TrainConfig = PACKED) -> Recipe:
    """A recipe whose record is a clean run of this loop: the figures it records, by their names."""
    report = meter.report()
    return recipe_of(config, {k: report[k] for k in RECIPE_FIGURES if k in report})


def clean_run(config: TrainConfig = PACKED) -> RunMeter:
    model = build_model("gpt2-tiny")
    recipe = recipe_of(config)
    return train(recipe, model, iter(recipe.dataloader(documents(), for_model=model)))


@pytest.mark.slow
def test_a_run_like_the_recipes_matches(tmp_path):
    """Two runs of eight 50 ms steps, one after the other: on a machine the other xdist worker
    shares (a compile there takes a core for seconds) one of them can read 15 % slow with no cause
    in it (0.82x in a whole-suite run on a loaded host). A run like the recipe's matches in one
    of three tries; on an idle machine, the first."""
    for _ in range(3):
        recipe = recorded_by(clean_run())
        model = build_model("gpt2-tiny")
        meter = train(recipe, model, iter(recipe.dataloader(documents(seed=1), for_model=model)))
        report = meter.report()
        if report["verdict"]["status"] == "matches":
            break
    assert report["steps"] == STEPS - 2 and report["warmup_steps"] == 2
    assert report["padding_fraction"] == 0.0 and report["peak_memory_source"] == "rss"
    assert report["verdict"]["status"] == "matches", report["verdict"]["line"]
    assert meter.verdict().startswith("matches:")
    saved = json.loads(meter.save(tmp_path / "run.json").read_text(encoding="utf-8"))
    assert saved["format"] == "autotune.meter" and saved["verdict"]["status"] == "matches"


class SlowCollate:
    """The collate of a loader that cannot keep up: 60 ms a batch, longer than gpt2-tiny's step."""

    def __init__(self, collate) -> None:
        self.collate = collate

    def __call__(self, items):
        time.sleep(0.06)
        return self.collate(items)


@pytest.mark.slow
def test_a_slow_collator_is_named():
    recipe = recorded_by(clean_run())
    model = build_model("gpt2-tiny")
    loader = recipe.dataloader(documents(seed=1), for_model=model)
    loader.collate_fn = SlowCollate(loader.collate_fn)
    meter = train(recipe, model, iter(loader))
    verdict = meter.judged()
    assert verdict.status == "short", verdict.line
    assert "waited for data" in verdict.line
    assert meter.figures().data_wait_fraction > 0.3


@pytest.mark.slow
def test_padded_batches_where_the_recipe_packs_are_named():
    recipe = recorded_by(clean_run())
    model = build_model("gpt2-tiny")
    # The user's own loader: short documents, each padded to the full context.
    padded = recipe_of(TrainConfig(token_budget=256, batching="fixed"))
    loader = padded.dataloader(documents(low=20, high=60, seed=1), for_model=model)
    meter = train(recipe, model, iter(loader))
    assert meter.figures().padding_fraction > 0.4
    assert "padding grew" in meter.verdict()


@pytest.mark.slow
def test_a_knob_left_out_of_the_model_is_named():
    """The recipe checkpoints block 0 under bfloat16 autocast; the loop applies neither."""
    config = TrainConfig(token_budget=256, batching="packed", amp_dtype="bfloat16", checkpoint_layers=(0,))
    recipe = recorded_by(clean_run(), config)
    model = build_model("gpt2-tiny")
    meter = train(recipe, model, iter(recipe.dataloader(documents(seed=1), for_model=model)), autocast=False)
    line = meter.verdict()
    assert "blocks [0] are not checkpointed" in line, line
    assert "the forward ran under float32, the recipe's is bfloat16" in line


@pytest.mark.slow
def test_the_knobs_applied_are_not_named():
    """The same recipe, applied (apply_to_model, autocast): nothing is said of its knobs."""
    config = TrainConfig(token_budget=256, batching="packed", amp_dtype="bfloat16", checkpoint_layers=(0,))
    recipe = recipe_of(config)
    model = recipe.apply_to_model(build_model("gpt2-tiny"))
    meter = train(recipe, model, iter(recipe.dataloader(documents(), for_model=model)), steps=3)
    assert meter.figures().autocast_seen == ["bfloat16"]
    assert meter.figures().knobs_not_in_effect == []


def memory_case() -> str:
    """The verdict on a loop that keeps twice the verdict's margin more memory than the recipe's
    run did (256 MiB at least), both runs in this process: `test_memory_above_the_recipes_is_named`
    runs it in a fresh interpreter."""
    recipe = recorded_by(clean_run())
    model = build_model("gpt2-tiny")
    extra = max(256 << 20, int(2 * MEMORY_MARGIN * recipe.measured["peak_memory_bytes"]))
    held = []
    meter = train(
        recipe,
        model,
        iter(recipe.dataloader(documents(seed=1), for_model=model)),
        during_step=lambda: held.append(torch.ones(extra // 4)) if not held else None,
    )
    return meter.verdict()


@pytest.mark.slow
def test_memory_above_the_recipes_is_named():
    """In a fresh interpreter: the verdict compares the process's RSS with the recipe's run, and
    an xdist worker's RSS moves between the two runs with whatever ran before in it (freed,
    collected, given back to the system). In the worker this test failed whole-suite runs, in CI
    and here, with a fixed 256 MiB, with twice the margin, and with the heap collected before each
    run; 1 GiB of cyclic garbage collected between the two runs, or 6 GiB held before them,
    reproduced it."""
    script = "from tests.recipe.test_meter import memory_case; print(memory_case())"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-c", script]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "above the recipe's" in done.stdout, done.stdout + done.stderr[-2000:]


def widths(*shapes: tuple[int, int]):
    """Batches of full rows of these (rows, width) shapes, in order."""
    generator = torch.Generator().manual_seed(0)
    for rows, width in shapes:
        ids = torch.randint(0, 256, (rows, width), generator=generator)
        yield {"input_ids": ids, "labels": ids}


@pytest.mark.slow
def test_a_recompile_during_the_run_is_named():
    """A compiled model (dynamo with its eager backend: the compile events without inductor's
    minutes on this CPU) given a new width after warm-up compiles again."""
    recipe = recipe_of(TrainConfig(token_budget=256, batching="packed", compile_mode="default"))
    model = torch.compile(build_model("gpt2-tiny"), backend="eager", dynamic=False)
    meter = train(recipe, model, widths(*[(2, 64)] * 4, *[(2, 32)] * 3), steps=7)
    figures = meter.figures()
    assert figures.steps >= 3 and figures.recompiles_during_run >= 1  # warm-up ends on a step with no compile
    assert figures.knobs_not_in_effect == []  # compiled whole: the recipe's compile is in effect
    assert "compiled" in meter.verdict() and "after warm-up" in meter.verdict()


@pytest.mark.cuda_fakes
def test_on_cuda_no_step_synchronizes(monkeypatch):
    """On a strict fake of CUDA: each step's end is an event, and the device is synchronized by
    no step, only when a report is asked for (the last event's wait)."""
    from tests.cuda_fakes import fake_gpu_machine

    recipe = recipe_of(measured={"tokens_per_sec": 1.0})
    with fake_gpu_machine(monkeypatch) as cuda:
        model = build_model("gpt2-tiny").to("cuda:0")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
        meter = recipe.meter(model, device="cuda:0")
        syncs = dict(cuda.sync_epoch)
        for batch in meter.batches(widths(*[(2, 32)] * 5)):
            batch = {k: v.to("cuda:0") for k, v in batch.items()}
            model(**batch).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        assert cuda.sync_epoch == syncs  # five steps, no synchronize
        assert len(cuda.event_devices) == 4 and set(cuda.event_devices) == {0}  # the window's marks
        figures = meter.figures()
        meter.close()
    assert figures.steps == 3 and figures.tokens_per_sec > 0
    assert figures.device["kind"] == "cuda"
    # MFU as the measuring loop computes it, at the forwards' mean width (32 here)
    from autotune.device import DeviceInfo
    from autotune.measure.flops import model_flops_utilization

    assert figures.mfu is not None and figures.mfu == pytest.approx(
        model_flops_utilization(
            figures.tokens_per_sec,
            n_params=meter.n_params,
            shape=meter.shape,
            width=32,
            device=DeviceInfo.from_dict(figures.device),
            amp_dtype=recipe.config.amp_dtype,
        )
    )


def run_file(tmp_path, **figures) -> str:
    """A meter report as RunMeter.save writes it, with these figures planted."""
    report = {"format": "autotune.meter", "version": 1, "steps": 8, "warmup_steps": 2, "device": {"kind": "cpu"}}
    path = tmp_path / "run.json"
    path.write_text(json.dumps({**report, **figures}), encoding="utf-8")
    return str(path)


def test_verify_from_a_run_file_judges_it_as_a_re_measurement(tmp_path):
    from tests.helpers import invoke

    recorded = {"tokens_per_sec": 1000.0, "data_wait_fraction": 0.0, "peak_memory_bytes": 1 << 30}
    recipe = str(recipe_of(measured=recorded).save(tmp_path / "r.json"))
    held = invoke("verify", recipe, "--from", run_file(tmp_path, tokens_per_sec=950.0, peak_memory_bytes=1 << 30))
    assert held.exit_code == 0, held.output
    assert "PASS" in held.stdout and "the meter: matches" in held.stdout
    slow = run_file(tmp_path, tokens_per_sec=400.0, data_wait_fraction=0.5, peak_memory_bytes=1 << 30)
    failed = invoke("verify", recipe, "--from", slow, "--json")
    assert failed.exit_code == 1
    result = json.loads(failed.stdout)
    assert result["passed"] is False and "below the 0.85x allowed" in result["reason"]
    assert "waited for data 50%" in result["reason"] and result["verdict"].startswith("short:")
    refused = invoke("verify", recipe, "--from", str(tmp_path / "r.json"))  # a recipe is no meter report
    assert refused.exit_code == 2 and "not a meter report" in refused.output


@pytest.mark.slow
@pytest.mark.cuda_fakes
def test_a_long_run_on_cuda_holds_the_events_the_device_has_not_passed_only(monkeypatch):
    """A meter left on for a whole training run: each step's end is a CUDA event, and the events
    the device has passed (here: before the loop's own synchronize every 5 steps, as logging a
    loss makes)
    become numbers and are released, without the meter waiting on any. It held one per step."""
    from tests.cuda_fakes import fake_gpu_machine

    recipe = recipe_of(measured={"tokens_per_sec": 1.0})
    with fake_gpu_machine(monkeypatch):
        model = build_model("gpt2-tiny").to("cuda:0")
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
        meter = recipe.meter(model, device="cuda:0")
        held = []
        for n, batch in enumerate(meter.batches(widths(*[(2, 32)] * 24))):
            batch = {k: v.to("cuda:0") for k, v in batch.items()}
            loss = model(**batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if n % 5 == 4:
                torch.cuda.synchronize()  # the loop's own (the fake's tensors live on the host: .item() would not)
            held.append(len(meter.clock.marks))
        figures = meter.figures()
        meter.close()
    assert max(held) <= 7, held  # the steps since the last synchronize, not every step
    assert figures.steps == 24 - figures.warmup_steps and figures.tokens_per_sec > 0
