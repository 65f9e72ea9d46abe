"""A shared recipe is data: its exports that are programs never run what its text fields say
(issue D, X01 and X02). Every string field of a recipe (its model, hardware and study names
first, which the exports name in comments) is filled with hostile text: a newline or another
line break that would end a comment, shell and Python quotes, `$(...)`. Each program export
must then be the program a clean recipe exports, with other text in its comments and strings:
the same Python syntax tree, and a shell script that runs as the clean one does (torchrun
and python stubbed on PATH) without creating the marker file."""

from __future__ import annotations

import ast
import copy
import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from autotune.config import GenerateConfig, TrainConfig
from autotune.integrations.export import render
from autotune.recipe import Recipe
from tests.helpers import HF, invoke

pytestmark = HF  # Lightning and transformers' Trainer share one xdist worker, which imports them once

MARKER = "PWNED"
EXPLICIT = [
    "x\nimport os; open('PWNED','w')",
    "x\r\n__import__('os').system('touch PWNED')",
    "x\rimport os; open('PWNED','w')",
    "x\u2028import os; open('PWNED','w')",
    "x\u0085import os\x0c\x0b\x1copen('PWNED','w')",
    "x\nexit(0)\ntouch PWNED",
    "'; touch PWNED; '",
    '"; touch PWNED; "',
    "$(touch PWNED)",
    "`touch PWNED`",
    "x\\\ntouch PWNED",
    "x\x00\x1b[2Jy\u202e",
]
# Line breaks of every kind, quotes and shell metacharacters, drawn often; any other character too.
DANGEROUS = list("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029\x00\x1b'\"\\`$();#{}|&") + ["\r\n", "touch PWNED"]
HOSTILE = st.lists(st.one_of(st.sampled_from(DANGEROUS), st.characters(blacklist_categories=("Cs",))), max_size=30).map(
    lambda parts: "x" + "".join(parts)
)


def training(world_size: int) -> Recipe:
    knobs = dict(parallelism="ddp", amp_dtype="bfloat16") if world_size > 1 else dict(amp_dtype="tf32")
    return Recipe(
        config=TrainConfig(num_workers=2, expandable_segments=True, **knobs),
        model={"name": "gpt2", "seq_len": 1024, "n_layer": 12},
        measured={"tokens_per_sec": 250000.0, "peak_memory_source": "nvml", "objective": "tokens_per_sec"},
        hardware={"kind": "cuda", "name": "NVIDIA H200"},
        software={"torch": "2.13.0"},
        study={"name": "gpt2-h200", "storage": "sqlite:///studies/gpt2-h200.db", "trial": 17},
        created="2026-01-01T00:00:00+00:00",
        world_size=world_size,
    )


def generation() -> Recipe:
    return Recipe(
        config=GenerateConfig(decode_sdpa="math", prefill_sdpa="efficient", decode_compile="default"),
        model={"name": "gpt2-tiny"},
        measured={"tokens_per_sec": 100.0, "generation": {"token_latency_p50_s": 0.001}},
        hardware={"kind": "cpu", "name": "a CPU"},
        study={"name": "gen", "trial": 3},
        task="generate",
        workload={"prompt_lens": [9], "new_tokens": 6, "agree_tokens": 8},
    )


# Every export that is a program, of the recipes that have one: Python, or shell.
PROGRAMS = [
    (lambda: training(1), "hf"),
    (lambda: training(1), "lightning"),
    (lambda: training(1), "torchrun"),
    (lambda: training(1), "env"),
    (lambda: training(2), "hf"),
    (lambda: training(2), "lightning"),
    (lambda: training(2), "torchrun"),
    (generation, "hf-generate"),
    (generation, "decode-loop"),
]
SHELL = ("torchrun", "env")


def hostile(recipe: Recipe, text: str) -> Recipe:
    """The recipe with `text` in every one of its string fields, nested ones included."""
    bad = copy.deepcopy(recipe)
    for section in (bad.model, bad.measured, bad.hardware, bad.software, bad.study, bad.measured.get("generation")):
        for key, value in (section or {}).items():
            if isinstance(value, str) or key in ("name", "token_latency_p50_s"):
                section[key] = text
    bad.data, bad.created = text, text
    return bad


def shape(source: str) -> str:
    """The Python syntax tree with every string constant blanked: what the program does."""

    class Blank(ast.NodeTransformer):
        def visit_Constant(self, node: ast.Constant) -> ast.Constant:
            return ast.Constant("") if isinstance(node.value, str) else node

    return ast.dump(Blank().visit(ast.parse(source)))


def run_shell(script: str) -> tuple[int, str, list[str]]:
    """`bash` on the script in an empty folder, torchrun, python and nproc stubbed on PATH: its exit
    status, what the stubs were called with, and the files left in the folder."""
    with tempfile.TemporaryDirectory() as tmp:
        stubs, work = Path(tmp, "bin"), Path(tmp, "work")
        stubs.mkdir()
        work.mkdir()
        for name in ("torchrun", "python", "nproc"):
            stub = stubs / name
            answer = "echo 8" if name == "nproc" else f'echo "{name} $*" >> ../calls'
            stub.write_text(f"#!/bin/sh\n{answer}\n")
            stub.chmod(0o755)
        checked = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True, timeout=10)
        assert checked.returncode == 0, checked.stderr
        env = {"PATH": f"{stubs}:/usr/bin:/bin", "HOME": tmp}
        done = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, timeout=10)
        calls = Path(tmp, "calls").read_text() if Path(tmp, "calls").exists() else ""
        return done.returncode, calls, sorted(os.listdir(work))


def check_same_program(make, fmt: str, text: str) -> None:
    clean = render(make(), fmt)
    bad = render(hostile(make(), text), fmt)
    if fmt in SHELL:
        status, calls, left = run_shell(bad)
        assert (status, left) == (0, []) and calls == run_shell(clean)[1]
    else:
        assert shape(bad) == shape(clean), bad
    # The hostile text never stands outside a comment: each line that carries it is one.
    for line in bad.splitlines():
        assert MARKER not in line or line.lstrip().startswith("#"), line


@pytest.mark.parametrize("make, fmt", PROGRAMS, ids=[f"{f}-{i}" for i, (_, f) in enumerate(PROGRAMS)])
@pytest.mark.parametrize("text", EXPLICIT)
def test_hostile_text_in_a_recipe_never_becomes_code_in_an_export(make, fmt, text):
    check_same_program(make, fmt, text)


@settings(max_examples=30, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=HOSTILE, which=st.sampled_from(range(len(PROGRAMS))))
@example(text="x\u2029import os", which=0)
@pytest.mark.slow
def test_any_text_in_a_recipes_fields_leaves_its_exports_the_same_program(text, which):
    make, fmt = PROGRAMS[which]
    check_same_program(make, fmt, text)


def test_the_comment_helper_leaves_no_line_break_and_keeps_letters():
    from autotune.integrations.common import comment

    for text in EXPLICIT + ["\u2028", "\u2029", "\x85", "\x0b\x0c\x1c\x1d\x1e"]:
        line = comment(text)
        assert line.startswith("# ") and len(line.splitlines()) == 1 and len(f"{line}\n".split("\n")) == 2
        assert ast.parse(f"{line}\nx = 1").body[0].targets[0].id == "x"
    assert comment("NVIDIA H200 für Größe 日本") == "# NVIDIA H200 für Größe 日本"


def test_export_refuses_a_recipe_whose_model_name_holds_a_line_break(tmp_path, monkeypatch):
    """A model name is one line (gpt2, hf:NAME, package.module:factory): the recipe loader refuses any
    other, so export refuses it as verify does, in one line, and writes nothing."""
    recipe = training(1).to_dict()
    recipe["model"]["name"] = EXPLICIT[0]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(recipe))
    monkeypatch.chdir(tmp_path)
    for args in (["export", str(path), "--format", "torchrun"], ["verify", str(path), "--device", "cpu"]):
        result = invoke(*args)
        assert result.exit_code == 2, result.output
        assert "model.name: expected a model name on one line" in result.output
        assert len(result.output.strip().splitlines()) == 1
    assert sorted(os.listdir(tmp_path)) == ["r.json"]
