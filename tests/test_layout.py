"""The package's layout, checked on its own source: no import cycle, imports run one way
(from the command line down to config, device and errors), and reading a stored study
imports no torch. Each rule fails the moment a change breaks it."""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.measure.outcomes import Outcome

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "autotune"

# Lower layers never import higher ones; a layer may import its own (sideways) and all below.
LAYERS = {
    "cli": 11,
    "search": 10,  # the tuner: preflight, tasks, objective, sampler, memory model, stop rule, confirmation, fleet
    "present": 10,  # reads studies through study/, never search/
    "integrations": 10,  # a recipe in the words of Hugging Face and Lightning; `export` formats
    "recipe": 9,  # the recipe file, applied in training code; verify, profile, soak check
    "study": 8,  # storages, opening a study, the typed trial and study records, summaries
    "trial": 7,
    "measure": 6,
    "knobs": 5,  # applied to a model: built on model/
    "model": 4,
    "data": 4,
    "space": 4,  # search spaces: read, validated, sampled (torch-free)
    "config": 3,  # TrainConfig made from the registry, validated with the environment's bounds
    "environment": 2,  # the AUTOTUNE_* variables, each declared and validated once
    "device": 2,
    "registry": 1,  # every knob declared once
    "units": 1,
    "errors": 0,
    "_version": 0,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py") if "search_spaces" not in p.parts}


@functools.cache
def parsed() -> dict[str, ast.Module]:
    """Every module's syntax tree, parsed once for the tests here (which only read them)."""
    return {name: ast.parse(path.read_text(encoding="utf-8")) for name, path in modules().items()}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every autotune module `name` imports, at module level or inside a function."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(parsed()[name]):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            # `from autotune.measure import outcomes` imports the module autotune.measure.outcomes
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import autotune.measure.loop` -> that module
                target = target.rpartition(".")[0]
            if target.startswith("autotune") and target != name:
                found.add(target)
    return found


@functools.cache
def _import_graph() -> dict[str, frozenset[str]]:
    mods = modules()
    return {name: frozenset(imports_of(name, path, set(mods))) for name, path in mods.items()}


def import_graph() -> dict[str, set[str]]:
    """A fresh copy each call: a test may add an edge to its own."""
    return {name: set(targets) for name, targets in _import_graph().items()}


def layer(name: str) -> int | None:
    parts = name.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 else None


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle in the graph as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


def test_every_subpackage_and_top_module_has_a_layer():
    tops = {name.split(".")[1] for name in modules() if "." in name and not name.endswith("__main__")}
    assert tops <= set(LAYERS) | {"__main__"}, sorted(tops - set(LAYERS))


def test_the_package_has_no_import_cycle():
    assert find_cycle(import_graph()) is None


def test_the_cycle_check_finds_a_cycle_when_one_is_added():
    graph = import_graph()
    graph["autotune.config"] = graph["autotune.config"] | {"autotune.study.record"}  # config -> study.record -> config
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1]


def package_graph() -> dict[str, set[str]]:
    """The import graph between top-level packages (autotune.search, autotune.study, ...)."""
    graph: dict[str, set[str]] = {}
    for name, targets in import_graph().items():
        source = ".".join(name.split(".")[:2])
        for target in targets:
            target = ".".join(target.split(".")[:2])
            if target != source:
                graph.setdefault(source, set()).add(target)
    return graph


def test_the_packages_have_no_import_cycle():
    """Not only modules: no package imports a package that imports it back (recipe <-> integrations was one)."""
    assert find_cycle(package_graph()) is None


def test_the_package_cycle_check_finds_one_when_added():
    graph = package_graph()
    graph.setdefault("autotune.recipe", set()).add("autotune.integrations")
    assert find_cycle(graph) is not None


def test_no_package_imports_another_of_its_floor():
    """A floor's packages are independent of each other: an import between two of them says one
    is built on the other, and belongs a floor up (knobs on model was one)."""
    sideways = sorted(
        f"{source} -> {target}"
        for source, targets in package_graph().items()
        for target in targets
        if layer(source) is not None and layer(source) == layer(target)
    )
    assert sideways == []


def test_presenters_read_studies_through_study_never_the_tuner():
    assert "autotune.search" not in package_graph().get("autotune.present", set())
    assert "autotune.search" not in package_graph().get("autotune.study", set())


def test_imports_run_one_way():
    upward = sorted(
        f"{name} -> {target}"
        for name, targets in import_graph().items()
        for target in targets
        if layer(name) is not None and layer(target) is not None and layer(target) > layer(name)
    )
    assert upward == []


# Every outcome, from the enum: a new one is guarded the day it is added.
OUTCOME_NAMES = {o.value for o in Outcome}


def outcome_literals(tree: ast.AST) -> list[int]:
    """Lines where an outcome is decided or tested by its literal name: compared with
    (`outcome == "ok"`, `in ("ok", ...)`) or given (`outcome="crashed"`)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            values = [
                o for op in operands for o in (op.elts if isinstance(op, ast.Tuple | ast.List | ast.Set) else [op])
            ]
            if any(isinstance(v, ast.Constant) and v.value in OUTCOME_NAMES for v in values):
                lines.append(node.lineno)
        elif isinstance(node, ast.keyword) and node.arg == "outcome":
            if isinstance(node.value, ast.Constant) and node.value.value in OUTCOME_NAMES:
                lines.append(node.value.lineno)
    return lines


def test_outcomes_are_decided_in_one_module():
    """Outside measure/outcomes.py, outcomes are its constants and functions, never literals."""
    spelled = [
        f"{name}:{line}"
        for name, tree in parsed().items()
        if name != "autotune.measure.outcomes"
        for line in outcome_literals(tree)
    ]
    assert spelled == []


def test_the_outcome_check_sees_a_literal_decision():
    assert outcome_literals(ast.parse('if m.outcome == "ok":\n    pass')) == [1]
    assert outcome_literals(ast.parse('x = o in ("ok", "over_memory_limit")')) == [1]
    assert outcome_literals(ast.parse('Measurement(config={}, outcome="crashed")')) == [1]
    assert outcome_literals(ast.parse('COLORS = {"ok": "#1f77b4"}')) == []


def test_private_optuna_attributes_are_read_in_one_function():
    readers = []
    for name, tree in parsed().items():
        for func in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)):
            for node in ast.walk(func):
                if isinstance(node, ast.Attribute) and node.attr in ("_storage", "_study_id", "_trial_id"):
                    readers.append(f"{name}.{func.name}")
    assert sorted(set(readers)) == ["autotune.study.storage.internals"]


CLI_IN_A_FRESH_PROCESS = """
import json, sys
from click.testing import CliRunner
from autotune.cli import main
runner = CliRunner()
results = [runner.invoke(main, args) for args in json.loads(sys.argv[1])]
print(json.dumps({"codes": [r.exit_code for r in results], "out": [r.output for r in results],
                  "torch": "torch" in sys.modules}))
"""


def cli_in_a_fresh_process(commands: list[list[str]], cwd: Path) -> dict:
    """Run autotune commands in one new interpreter: exit codes, outputs, and whether torch
    was imported by the end."""
    proc = subprocess.run(
        [sys.executable, "-c", CLI_IN_A_FRESH_PROCESS, json.dumps(commands)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["codes"] == [0] * len(commands), result["out"]
    return result


@pytest.mark.process
def test_reading_a_study_does_not_import_torch(tmp_path):
    import optuna

    from autotune.config import TrainConfig

    url = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(study_name="s", storage=url, direction="maximize")
    for key, value in {
        "model": "gpt2-tiny",
        "seq_len": 128,
        "memory_limit_bytes": 10**9,
        "hardware": {"kind": "cpu", "name": "a CPU"},
    }.items():
        study.set_user_attr(key, value)
    config = TrainConfig().to_dict()
    measurement = {"config": config, "outcome": "ok", "tokens_per_sec": 1000.0, "peak_memory_bytes": 10**8}
    study.add_trial(
        optuna.trial.create_trial(
            value=1000.0,
            user_attrs={
                "outcome": "ok",
                "config": config,
                "measurement": measurement,
                "tokens_per_sec": 1000.0,
                "peak_memory_bytes": 10**8,
            },
        )
    )
    commands = [
        ["show", "--storage", url, "--study", "s"],
        ["show", "--storage", url, "--study", "s", "--json"],
        ["compare", str(tmp_path / "s.db")],
        ["export", "--storage", url, "--study", "s", "--format", "yaml"],
        ["export", "--storage", url, "--study", "s", "--format", "json"],
        # Not `--format hf` or `lightning`: they name their fields from the installed library
        # (transformers' TrainingArguments, Lightning's Trainer), which imports torch.
    ]
    assert cli_in_a_fresh_process(commands, tmp_path)["torch"] is False


@pytest.mark.process
def test_the_tuner_of_a_search_does_not_import_torch(searched):
    """The tuner validates, samples, records and writes the recipe; the trials import torch in
    their own processes. In the tuner torch would cost seconds of CPU at every start and
    hundreds of MiB for nothing. Read from the session's `autotune search` (references,
    sampled trials, the leaders measured again, the recipe written)."""
    from tests.helpers import recorded_imports

    records = recorded_imports(searched.imports)
    tuners = [r for r in records if r["argv"][0].endswith("__main__.py") and r["argv"][1:2] == ["search"]]
    assert len(tuners) == 1, records
    assert tuners[0]["torch"] is False
    # The record sees torch where it is: the fork server the trials came from (`python -c`).
    assert any(r["torch"] for r in records if r["argv"] == ["-c"]), records
