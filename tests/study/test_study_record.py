"""The study's typed record: written in one place (a task's `record()`, at the study's making),
read in one place (`StudyRecord.read`), with the defaults an older study was measured under."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from autotune.study.study_record import RunRules, StudyRecord
from tests.helpers import tiny_context

PACKAGE = Path(__file__).resolve().parents[2] / "autotune"


def test_a_training_studys_record_reads_back_whole_and_keeps_the_attrs_it_always_had():
    record = tiny_context().record()
    attrs = record.attrs()
    assert StudyRecord.read(attrs) == record
    # The names every existing study carries (and optuna-dashboard shows) are the ones written.
    assert {"autotune", "hardware", "model", "data", "seq_len", "n_layer", "memory_limit_bytes"} <= set(attrs)
    assert {"memory_headroom", "objective", "space", "space_source", "space_hash", "identity", "run"} <= set(attrs)
    assert attrs["run"] == {"warmup": 1, "steps": 4, "min_time_s": 0, "seed": 0, "global_batch_tokens": None}
    assert "workload" not in attrs and "bounds" not in attrs  # a generation study's


def test_a_generation_studys_record_reads_back_whole():
    from autotune.config import GenerateSpec
    from autotune.device import describe
    from autotune.search.generate import GenerateTask
    from autotune.search.generation_space import GenerationSpace

    task = GenerateTask(
        spec=GenerateSpec(model="gpt2-tiny", device="cpu", prompt_lens=(8, 16), new_tokens=4),
        space=GenerationSpace({"batch_size": (1, 2)}),
        device=describe("cpu"),
        memory_limit_bytes=2**30,
        trial_timeout_s=60,
        max_ttft_s=0.5,
    )
    record = task.record()
    assert StudyRecord.read(record.attrs()) == record
    assert record.task == "generate" and record.bounds == {"p99_token_latency": None, "ttft": 0.5}
    assert record.workload["prompt_lens"] == [8, 16] and record.data is None


def test_a_study_made_before_a_field_existed_reads_with_what_it_was_measured_under():
    old = StudyRecord.read({"model": "gpt2", "memory_limit_bytes": 10**9, "run": {"steps": 10}})
    assert (old.task, old.objective, old.headroom, old.run.nproc_per_node) == ("train", "tokens_per_sec", 0.0, 1)
    assert old.run == RunRules(steps=10)


def test_a_field_of_the_wrong_type_reads_as_absent():
    edited = StudyRecord.read(
        {"memory_limit_bytes": "lots", "hardware": ["x"], "run": {"nproc_per_node": True}, "objective": 3}
    )
    assert edited == StudyRecord()


def test_no_module_but_the_record_reads_a_study_attr_by_name():
    """`study.user_attrs.get("model")` anywhere else is a second reader, with its own default."""
    names = {f.name for f in dataclasses.fields(StudyRecord)} | {"autotune"}
    readers = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "study_record.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
                target, key = node.func.value, node.args[0] if node.args else None
            elif isinstance(node, ast.Subscript):
                target, key = node.value, node.slice
            else:
                continue
            study_attrs = (isinstance(target, ast.Attribute) and target.attr == "user_attrs") or (
                isinstance(target, ast.Name) and target.id in ("attrs", "study_attrs")
            )
            if study_attrs and isinstance(key, ast.Constant) and key.value in names:
                readers.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {key.value}")
    assert readers == []
