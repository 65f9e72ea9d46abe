"""Hugging Face models through the measuring loop and the command line: `autotune bench --model
hf:gpt2-tiny` end to end, an HF Llama with a checkpointed block and forced SDPA, a user factory
returning a plain `GPT2LMHeadModel` (it was recorded `crashed`), and a wrapper whose loss shifts
the labels again (it was accepted silently; now refused with the fix)."""

from __future__ import annotations

import importlib
import json
import math

import pytest

from autotune.config import RunSpec, TrainConfig
from autotune.errors import UsageError
from autotune.measure import outcomes
from autotune.measure.loop import measure
from tests.helpers import FAST, HF, invoke

pytestmark = HF


def test_bench_builds_only_a_users_code_in_a_child_first(monkeypatch, tmp_path):
    """bench measures in its own process. A user's factory or config directory is built in a
    child first, under a timeout (one line if it raises, exits or hangs); autotune's own models
    are not: for an `hf:` one, that child was a second interpreter importing torch and
    transformers (~13 s of CPU here) to build what bench then built again."""
    import autotune.trial.probe

    bench_cli = importlib.import_module("autotune.cli.bench")  # the module: autotune.cli.bench is the command

    probed = []
    monkeypatch.setattr(autotune.trial.probe, "probe", lambda model, **kw: probed.append(model))
    (tmp_path / "config.json").write_text("{}")  # a user's config directory, as far as bench can tell
    users = ["tests.fixture_models:make_llama", f"hf:{tmp_path}"]
    for model in ["gpt2-tiny", "hf:gpt2-tiny", "hf:llama-tiny", *users]:
        assert bench_cli._run_spec(model, "cpu", "synthetic", None, 1, 2, 0.0, 0).model == model
    assert probed == users


@pytest.mark.slow
def test_bench_an_hf_model_end_to_end():
    # 1024 tokens: 9 batch shapes warmed up at bench's 8192 would be most of the run
    result = invoke("bench", "--model", "hf:gpt2-tiny", *FAST, "--set", "token_budget=1024", "--json")
    assert result.exit_code == 0, result.stderr
    m = json.loads(result.stdout)
    assert m["outcome"] == outcomes.OK and m["tokens_per_sec"] > 0
    assert m["model"] == {
        "name": "hf:gpt2-tiny",
        "non_embedding_params": 120576,
        "seq_len": 128,
        "n_layer": 2,
        "vocab_size": 320,
    }
    assert math.isfinite(m["final_loss"]) and 4.0 < m["final_loss"] < 7.0  # about ln(320) at random weights


@pytest.mark.process  # bench builds a user's factory in a trial process first (trial.probe)
def test_bench_refuses_a_wrapper_that_shifts_labels_again():
    model = "tests.model.hf_factories:shifting_wrapper"
    result = invoke("bench", "--model", model, "--device", "cpu", "--min-time", "0", "--steps", "2", "--warmup", "0")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(
        "Error: model 'tests.model.hf_factories:shifting_wrapper' shifts the labels it is given"
    )


@pytest.mark.slow
def test_an_hf_llama_with_a_checkpointed_block_and_forced_sdpa_is_measured():
    spec = RunSpec(model="hf:llama-tiny", device="cpu", warmup=1, steps=2, min_time_s=0)
    m = measure(spec, TrainConfig(token_budget=256, checkpoint_layers=(0,), sdpa_backend="math"))
    assert m.outcome == outcomes.OK, m.reason
    assert m.model["n_layer"] == 2 and m.tokens_per_sec > 0 and math.isfinite(m.final_loss)


@pytest.mark.slow
def test_a_factory_returning_a_plain_hf_model_is_measured():
    spec = RunSpec(model="tests.model.hf_factories:plain_gpt2", device="cpu", warmup=1, steps=2, min_time_s=0)
    m = measure(spec, TrainConfig(token_budget=256))
    assert m.outcome == outcomes.OK, m.reason  # was crashed: 'Tensor' object has no attribute 'get_seq_length'


def test_measure_refuses_a_wrapper_that_shifts_labels_again():
    spec = RunSpec(model="tests.model.hf_factories:shifting_wrapper", device="cpu", warmup=1, steps=2, min_time_s=0)
    with pytest.raises(UsageError, match="shifts the labels it is given"):
        measure(spec, TrainConfig(token_budget=2048))
