"""The meter as Hugging Face Trainer and Lightning callbacks (autotune/integrations/hf.py,
lightning.py): real runs of a few gpt2-tiny steps on the CPU, each leaving its report beside the
run's output and its verdict in the log."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest
import torch

from autotune.config import TrainConfig
from autotune.model.load import build_model
from autotune.recipe import Recipe

# Lightning and transformers' Trainer cost ~12 s of CPU to import: one xdist worker pays it once.
pytestmark = pytest.mark.xdist_group("integrations")

CONFIG = TrainConfig(token_budget=256, batching="padded", checkpoint_layers=(0,))


def recipe() -> Recipe:
    return Recipe(
        config=CONFIG,
        model={"name": "gpt2-tiny"},
        measured={"tokens_per_sec": 1e9, "padding_fraction": 0.0},  # a record no CPU run reaches
        hardware={"kind": "cpu"},
    )


def documents(count: int = 40) -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, int(n)).tolist() for n in rng.integers(40, 129, count)]


def read_report(path) -> dict:
    report = json.loads(path.read_text(encoding="utf-8"))
    assert report["format"] == "autotune.meter" and report["steps"] >= 1
    return report


@pytest.mark.slow
def test_a_trainer_run_with_the_callback_writes_its_report(tmp_path, monkeypatch, caplog):
    transformers = pytest.importorskip("transformers")
    from autotune.integrations import hf

    monkeypatch.setattr(os, "environ", os.environ.copy())  # what TrainingArguments writes stays in the copy
    model = recipe().apply_to_model(build_model("hf:gpt2-tiny"))
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=5, use_cpu=True, report_to=[], save_strategy="no", disable_tqdm=True
    )
    trainer = transformers.Trainer(
        model=model,
        args=args,
        train_dataset=[{"input_ids": ids} for ids in documents()],
        data_collator=hf.data_collator(model),
        callbacks=[hf.RecipeCallback(recipe())],
    )
    with caplog.at_level(logging.INFO, logger="autotune"):
        trainer.train()
    report = read_report(tmp_path / "autotune_meter.json")
    assert report["steps"] + report["warmup_steps"] == 5
    assert report["tokens_per_sec"] > 0 and report["data_wait_fraction"] is not None
    assert report["knobs_not_in_effect"] == [] and report["verdict"]["status"] == "short"
    assert any(r.getMessage().startswith("autotune: short:") for r in caplog.records)


@pytest.mark.filterwarnings("ignore:::lightning")
@pytest.mark.slow
def test_a_lightning_run_with_the_callback_writes_its_report(tmp_path, caplog):
    lightning = pytest.importorskip("lightning")
    from autotune.integrations import lightning as autotune_lightning

    class CausalLM(lightning.LightningModule):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def training_step(self, batch, batch_idx):
            output = self.model(**batch)
            return getattr(output, "loss", output)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=3e-4)

    model = build_model("hf:gpt2-tiny")  # the recipe's checkpointing left out: the verdict names it
    trainer = lightning.Trainer(
        max_steps=5,
        accelerator="cpu",
        default_root_dir=str(tmp_path),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[autotune_lightning.RecipeCallback(recipe())],
    )
    with caplog.at_level(logging.INFO, logger="autotune"):
        trainer.fit(CausalLM(model), train_dataloaders=recipe().dataloader(documents(), for_model=model))
    report = read_report(tmp_path / "autotune_meter.json")
    assert report["steps"] + report["warmup_steps"] == 5 and report["data_wait_fraction"] is not None
    assert report["knobs_not_in_effect"] == ["blocks [0] are not checkpointed (recipe.apply_to_model)"]
    assert any("not checkpointed" in r.getMessage() for r in caplog.records)
