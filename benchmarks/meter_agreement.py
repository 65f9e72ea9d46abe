"""Does the meter in the user's own loop agree with `autotune bench` on the same configuration?
`autotune bench --json` measures hf:gpt2-tiny on the CPU (fixed batches of 8 x 128 tokens of the
synthetic data, float32); the same recipe then runs, with its meter, in a plain PyTorch loop, a
Hugging Face Trainer (`hf.RecipeCallback`) and a Lightning Trainer (`lightning.RecipeCallback`),
each on the same synthetic documents. Printed: each run's tokens/s of real targets, its ratio to
bench's, bench's 95 % interval, and the meter's verdict.

    python benchmarks/meter_agreement.py [--steps 60] [--json]

The loops differ from bench's in what they do besides the step (Trainer's and Lightning's own
work per step is part of the run, as it is in the user's), so "agree" means within the
tolerance verify allows on a CPU, not equal."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import _common  # noqa: F401
import torch
from _common import ROOT, md_table

from autotune.data.datasets import make_dataset
from autotune.model.load import build_model
from autotune.recipe import Recipe

MODEL, SEQ, BUDGET = "hf:gpt2-tiny", 128, 1024
KNOBS = {"batching": "fixed", "token_budget": BUDGET, "num_workers": 0}


def bench(steps: int) -> dict:
    sets = [a for k, v in KNOBS.items() for a in ("--set", f"{k}={v}")]
    cmd = [sys.executable, "-m", "autotune", "bench", "--model", MODEL, "--device", "cpu", "--seq-len", str(SEQ)]
    cmd += ["--steps", str(steps), "--json", *sets]
    return json.loads(subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout)


def recipe_of(measured: dict) -> Recipe:
    record = {
        k: measured[k] for k in ("tokens_per_sec", "tokens_per_sec_ci95", "padding_fraction", "peak_memory_bytes")
    }
    record |= {
        "data_wait_fraction": measured["data_wait_fraction"],
        "peak_memory_source": measured["peak_memory_source"],
    }
    from autotune.config import TrainConfig

    config = TrainConfig.from_dict(measured["config"])
    return Recipe(config=config, model={"name": MODEL, "seq_len": SEQ}, measured=record, hardware={"kind": "cpu"})


def documents(model) -> list[list[int]]:
    data = make_dataset("synthetic", vocab_size=model.config.vocab_size, seq_len=SEQ, min_tokens=400_000)
    return [data[i].tolist()[:SEQ] for i in range(len(data))]  # a document of 129 is 128 targets either way


def plain(recipe: Recipe, docs: list[list[int]], steps: int) -> dict:
    model = recipe.apply_to_model(build_model(MODEL))
    loader = recipe.dataloader(docs, for_model=model)
    optimizer = torch.optim.AdamW(model.parameters())
    meter = recipe.meter(model)
    for n, batch in enumerate(meter.batches(loader)):
        with recipe.autocast("cpu"):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if n + 1 >= steps:
            break
    return meter.report()


def trainer(recipe: Recipe, docs: list[list[int]], steps: int, out: Path) -> dict:
    import transformers

    from autotune.integrations import hf

    model = recipe.apply_to_model(build_model(MODEL))
    args = transformers.TrainingArguments(
        output_dir=str(out),
        max_steps=steps,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        **hf.training_arguments(recipe, model_applied=True),  # the recipe's batch of 8 sequences, workers, precision
    )
    hf_trainer = transformers.Trainer(
        model=model,
        args=args,
        train_dataset=[{"input_ids": ids} for ids in docs],
        data_collator=hf.data_collator(model),
        callbacks=[hf.RecipeCallback(recipe)],
    )
    hf_trainer.train()
    return json.loads((out / "autotune_meter.json").read_text())


def lightning_fit(recipe: Recipe, docs: list[list[int]], steps: int, out: Path) -> dict:
    import lightning

    from autotune.integrations import lightning as autotune_lightning

    class CausalLM(lightning.LightningModule):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def training_step(self, batch, batch_idx):
            return self.model(**batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters())

    model = recipe.apply_to_model(build_model(MODEL))
    fit = lightning.Trainer(
        max_steps=steps,
        accelerator="cpu",
        default_root_dir=str(out),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[autotune_lightning.RecipeCallback(recipe)],
    )
    fit.fit(CausalLM(model), train_dataloaders=recipe.dataloader(docs, for_model=model))
    return json.loads((out / "autotune_meter.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    measured = bench(args.steps)
    recipe = recipe_of(measured)
    docs = documents(build_model(MODEL))
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        runs["plain loop"] = plain(recipe, docs, args.steps)
        runs["HF Trainer"] = trainer(recipe, docs, args.steps, Path(tmp) / "hf")
        runs["Lightning"] = lightning_fit(recipe, docs, args.steps, Path(tmp) / "pl")
    if args.json:
        print(json.dumps({"bench": measured, "runs": runs}, indent=2, default=str))
        return
    low, high = measured["tokens_per_sec_ci95"]
    rows = [
        [
            "autotune bench",
            f"{measured['tokens_per_sec']:,.0f}",
            "1.00",
            "1.00",
            f"{measured['padding_fraction']:.0%}",
            "-",
        ]
    ]
    for name, r in runs.items():
        ratio = r["tokens_per_sec"] / measured["tokens_per_sec"]
        padded = r["padded_tokens_per_sec"] / measured["padded_tokens_per_sec"]
        cells = [f"{r['tokens_per_sec']:,.0f}", f"{ratio:.2f}", f"{padded:.2f}", f"{r['padding_fraction']:.0%}"]
        rows.append([name, *cells, r["verdict"]["line"]])
    headers = ["run", "tokens/s (real targets)", "x bench", "padded tokens/s x bench", "padding", "verdict"]
    print(md_table(headers, rows))
    print(f"\nbench's 95 % interval: {low:,.0f} - {high:,.0f} tokens/s; {args.steps} steps each")
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
