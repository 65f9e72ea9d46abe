"""The documentation's code runs as printed (examples/readme_snippets.md holds each block; the
README prints the training loop, docs/recipes.md the others, docs/generation.md generation's):
the training loop on autotune's GPT-2, a Hugging Face GPT-2 and a Hugging Face
Llama; a Trainer run and a Lightning run of three steps, with the real libraries, on the CPU; the
loop of a recipe of several ranks in two processes, each given the environment torchrun gives."""

from __future__ import annotations

import math
import os
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from autotune.config import TrainConfig
from autotune.errors import RecipeEnvironmentWarning
from autotune.model.load import build_model
from autotune.recipe import Recipe

# Lightning and transformers' Trainer cost ~12 s of CPU to import in a process: the tests that
# import them share one xdist worker (conftest: --dist loadgroup), which pays it once.
pytestmark = pytest.mark.xdist_group("integrations")

SNIPPETS = Path(__file__).resolve().parents[2] / "examples" / "readme_snippets.md"
ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# Where each block of examples/readme_snippets.md is printed, character for character.
PRINTED_IN = {
    "Applying a recipe in training code": README,
    "With Hugging Face Trainer": ROOT / "docs" / "recipes.md",
    "With Lightning": ROOT / "docs" / "recipes.md",
    "A recipe of several ranks": ROOT / "docs" / "recipes.md",
    "Applying a generation recipe": ROOT / "docs" / "generation.md",
    "With Hugging Face generate": ROOT / "docs" / "generation.md",
}
# What the snippets load: runnable on a CPU, and exercising what HF models tripped over:
# checkpointed blocks, bf16 autocast, a forced SDPA backend, token-budget batches.
CONFIG = TrainConfig(
    token_budget=1024, batching="padded", amp_dtype="bfloat16", sdpa_backend="math", checkpoint_layers=(0,)
)


def snippet(section: str) -> str:
    text = SNIPPETS.read_text(encoding="utf-8")
    found = re.search(rf"^## {re.escape(section)}\n.*?```python\n(.*?)```", text, flags=re.S | re.M)
    assert found, f"no ```python block under '## {section}' in {SNIPPETS}"
    return found.group(1)


def run(code: str, **names) -> dict:
    namespace = dict(names)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecipeEnvironmentWarning)  # "measured elsewhere": it was
        exec(compile(code, str(SNIPPETS), "exec"), namespace)
    return namespace


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """A directory holding recipes/gpt2-nvidia-h200.json, the file the snippets load. The
    environment comes back as it was: TrainingArguments writes ACCELERATE_* variables."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(os, "environ", os.environ.copy())  # what Trainer writes stays in the copy
    Recipe(
        config=CONFIG,
        model={"name": "gpt2-tiny", "seq_len": 128, "n_layer": 2},
        hardware={"kind": "cpu", "name": "a CPU"},
    ).save(tmp_path / "recipes" / "gpt2-nvidia-h200.json")
    return tmp_path


def documents(count: int = 24) -> list[list[int]]:
    """Token sequences of 1 to 128 tokens (one too short to train on, one of the full context)."""
    rng = np.random.default_rng(0)
    lengths = [1, 128, *rng.integers(2, 129, count - 2)]
    return [rng.integers(0, 256, int(n)).tolist() for n in lengths]


# What CPU searches of gpt2-tiny choose: flash attention (GPT-2's attention dropout of 0.1 has no
# CPU flash kernel: "No available kernel"), the chunked loss (it was refused on HF models), packed.
CPU_CONFIG = TrainConfig(token_budget=1024, batching="packed", sdpa_backend="flash", loss_impl="chunked")


@pytest.mark.parametrize("name", ["hf:gpt2-tiny", "hf:llama-tiny"])
def test_the_training_loop_runs_a_cpu_recipe_on_hf_models(name, workdir):
    Recipe(config=CPU_CONFIG, model={"name": "gpt2-tiny", "seq_len": 128}, hardware={"kind": "cpu"}).save(
        workdir / "recipes" / "gpt2-nvidia-h200.json"
    )
    torch.manual_seed(0)
    model = build_model(name)
    ns = run(snippet("Applying a recipe in training code"), model=model, dataset=documents(40))
    assert math.isfinite(ns["loss"].item()) and ns["output"].logits is None  # the chunked loss ran


@pytest.mark.parametrize("name", ["gpt2-tiny", "hf:gpt2-tiny", "hf:llama-tiny"])
@pytest.mark.slow
def test_the_training_loop_runs_as_written(name, workdir):
    torch.manual_seed(0)
    model = build_model(name)
    before = [p.detach().clone() for p in model.parameters()]
    # Ten documents: two token-budget batches of two widths (24 make three, a second longer).
    ns = run(snippet("Applying a recipe in training code"), model=model, dataset=documents(10))
    assert math.isfinite(ns["loss"].item())
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters()))


@pytest.mark.slow
def test_a_trainer_run_with_a_recipe(workdir):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    code = snippet("With Hugging Face Trainer")
    assert code.count("max_steps=1000") == 1
    ns = run(code.replace("max_steps=1000", "max_steps=3"), model=build_model("hf:gpt2-tiny"), dataset=documents())
    trainer = ns["trainer"]
    assert trainer.state.global_step == 3
    assert ns["args"].bf16 and ns["args"].use_cpu  # the CPU recipe's bf16, which needs use_cpu
    losses = [entry["train_loss"] for entry in trainer.state.log_history if "train_loss" in entry]
    assert losses and all(math.isfinite(v) for v in losses)


# Lightning's advice on a three-step CPU run (no TensorBoard, fewer batches than its log
# interval) is noise here, and costly: pytest-xdist's controller imports the module of each
# warning's class to show it, and importing Lightning takes it ~10 s, in which this worker's
# reports back up and it waits.
@pytest.mark.filterwarnings("ignore:::lightning")
@pytest.mark.slow
def test_a_lightning_run_with_a_recipe(workdir):
    pytest.importorskip("lightning")
    code = snippet("With Lightning")
    assert code.count("max_steps=1000") == 1
    model = build_model("hf:llama-tiny")
    before = [p.detach().clone() for p in model.parameters()]
    ns = run(code.replace("max_steps=1000", "max_steps=3"), model=model, dataset=documents())
    trainer = ns["trainer"]
    assert trainer.global_step == 3 and trainer.precision == "bf16-mixed"
    assert any(not torch.equal(a, b.detach().cpu()) for a, b in zip(before, model.parameters()))


def _a_rank_runs_the_snippet(rank: int, port: int, out: str) -> None:
    """What torchrun gives each rank (its environment), then docs/recipes.md's block as printed."""
    torch.set_num_threads(1)
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.manual_seed(0)  # the same initial weights on both ranks (DDP broadcasts rank 0's anyway)
    model = build_model("gpt2-tiny")
    ns = run(snippet("A recipe of several ranks"), model=model, dataset=documents(16))
    params = {name: p.detach().clone() for name, p in ns["model"].module.named_parameters()}
    steps = ns["i"] + 1
    saved = dict(params=params, steps=steps, loss=ns["loss"].item(), kind=type(ns["model"]).__name__)
    torch.save(saved, f"{out}-{rank}.pt")


@pytest.mark.process
def test_the_loop_of_a_recipe_of_several_ranks_runs_under_two_ranks(workdir):
    """Two ranks (forked, gloo): DDP, accumulation of two micro-batches, each rank its share;
    afterwards both hold the same parameters, and they moved."""
    import socket

    import torch.multiprocessing as mp

    Recipe(
        config=TrainConfig(token_budget=256, batching="padded", parallelism="ddp", bucket_cap_mb=1),
        model={"name": "gpt2-tiny", "seq_len": 128, "n_layer": 2},
        hardware={"kind": "cpu", "name": "a CPU"},
        global_batch_tokens=256 * 2 * 2,
        world_size=2,
    ).save(workdir / "recipes" / "gpt2-4xh200.json")
    with socket.socket() as probe:  # a free port for the rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = mp.start_processes(
        _a_rank_runs_the_snippet,
        args=(port, str(workdir / "rank")),
        nprocs=2,
        join=False,
        start_method="fork",
    )
    try:
        while not context.join(timeout=120):
            pass
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    ranks = [torch.load(workdir / f"rank-{r}.pt") for r in range(2)]
    assert [r["kind"] for r in ranks] == ["DistributedDataParallel"] * 2
    assert ranks[0]["steps"] == ranks[1]["steps"] >= 2 and all(math.isfinite(r["loss"]) for r in ranks)
    torch.manual_seed(0)
    before = dict(build_model("gpt2-tiny").named_parameters())
    for name, value in ranks[0]["params"].items():
        assert torch.equal(value, ranks[1]["params"][name]), name  # one model, trained on both ranks
    assert any(not torch.equal(value, before[name].detach()) for name, value in ranks[0]["params"].items())


def test_every_snippet_is_printed_somewhere():
    """Each ## section of examples/readme_snippets.md says where it is printed (PRINTED_IN)."""
    sections = re.findall(r"^## (.+)$", SNIPPETS.read_text(encoding="utf-8"), flags=re.M)
    assert sections == list(PRINTED_IN)


def assert_printed_as_it_runs(section: str) -> None:
    page = PRINTED_IN[section]
    assert f"```python\n{snippet(section)}```" in page.read_text(encoding="utf-8"), f"{section}: {page.name}"


@pytest.mark.parametrize(
    "section",
    ["Applying a recipe in training code", "With Hugging Face Trainer", "With Lightning", "A recipe of several ranks"],
)
def test_the_docs_print_each_block_as_it_runs_here(section):
    """The blocks the tests run are the README's and docs/recipes.md's own, character for character."""
    assert_printed_as_it_runs(section)


def test_the_readme_prints_the_training_loop_as_it_runs_here():
    """The quick start's loop, in README.md itself (not only in a docs page)."""
    assert PRINTED_IN["Applying a recipe in training code"] == README
    assert f"```python\n{snippet('Applying a recipe in training code')}```" in README.read_text(encoding="utf-8")
