"""The suite's own collection: a test module that runs no model imports no torch when it is
collected (torch costs 2-5 s of CPU to import here, paid by every process that collects it: each
xdist worker, `pytest tests/test_readme.py`). The modules that do import it at their top are
listed below; a new module is torch-free unless it is added there. Checked for real: every test
module collected in a fresh pytest under tests/torchless.py, which makes importing torch an error."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT
from tests.torchless import MESSAGE, RefuseTorch

# The modules that import torch when collected (at their top, or through a helper or an autotune
# package that does): each steps, builds or compiles a model in the test process, computes with
# tensors (batches, loaders, losses), reads torch's own settings, or takes the CUDA fakes
# (tests/cuda_fakes.py, which stand in for torch.cuda) in its parameters. Torch-free modules put
# `import torch` in the test that needs it, and read constants from torch-free helpers
# (tests/fault_env.py, not tests/fault_models.py).
TORCH_MODULES = frozenset(
    {
        "tests/cli/test_doctor.py",
        "tests/cli/test_hf_bench.py",
        "tests/data/test_batching.py",
        "tests/data/test_datasets.py",
        "tests/data/test_packing.py",
        "tests/data/test_packing_documents.py",
        "tests/data/test_tokenize.py",  # autotune.data's package imports its loaders
        "tests/device/test_cuda_fakes.py",
        "tests/device/test_nvml_container.py",
        "tests/examples/test_generation_snippets.py",
        "tests/examples/test_readme_snippets.py",
        "tests/knobs/test_attention_assumptions.py",
        "tests/knobs/test_checkpoint.py",
        "tests/knobs/test_checkpoint_compile.py",
        "tests/knobs/test_compile.py",
        "tests/knobs/test_compile_scope.py",
        "tests/knobs/test_cpu_threads.py",
        "tests/knobs/test_expandable_segments.py",
        "tests/knobs/test_generation_knobs.py",
        "tests/knobs/test_knob_support.py",
        "tests/knobs/test_parallel_knobs.py",
        "tests/knobs/test_precision.py",
        "tests/knobs/test_tf32.py",
        "tests/measure/test_accumulation.py",
        "tests/measure/test_cuda_paths.py",
        "tests/measure/test_cuda_reserved.py",
        "tests/measure/test_diverged.py",
        "tests/measure/test_energy.py",
        "tests/measure/test_epochs.py",
        "tests/measure/test_extremes.py",
        "tests/measure/test_flops.py",
        "tests/measure/test_generation.py",
        "tests/measure/test_gradient_sync.py",
        "tests/measure/test_loop.py",
        "tests/measure/test_new_knobs_in_the_loop.py",
        "tests/measure/test_profile.py",
        "tests/measure/test_profile_compiled.py",
        "tests/measure/test_step_cv.py",
        "tests/measure/test_tree_memory.py",
        "tests/measure/test_warmup.py",
        "tests/model/test_decode.py",
        "tests/model/test_document_attention.py",
        "tests/model/test_gpt.py",
        "tests/model/test_hf_chunked_loss.py",
        "tests/model/test_hf_models.py",
        "tests/model/test_introspect.py",
        "tests/model/test_load.py",
        "tests/model/test_loss.py",
        "tests/recipe/test_generation_recipe.py",
        "tests/recipe/test_hf_dataloader.py",
        "tests/recipe/test_integrations.py",
        "tests/recipe/test_meter_integrations.py",
        "tests/recipe/test_meter.py",
        "tests/recipe/test_packed_epoch.py",
        "tests/recipe/test_profile.py",
        "tests/recipe/test_ranks_training.py",
        "tests/recipe/test_training.py",
        "tests/trial/test_parity.py",
    }
)


def refused_at_collection(output: str) -> dict[str, str]:
    """The modules whose collection error is the refused torch import (other errors are not),
    each with its traceback."""
    sections = re.split(r"^_+ ERROR collecting (\S+) _+$", output, flags=re.M)
    return {path: text for path, text in zip(sections[1::2], sections[2::2]) if MESSAGE in text}


def test_the_refusal_stops_torch_and_nothing_else():
    finder = RefuseTorch()
    for name in ("torch", "torch._dynamo", "torch.nn.functional"):
        with pytest.raises(ImportError, match="runs no model"):
            finder.find_spec(name)
    assert finder.find_spec("torchvision") is None and finder.find_spec("optuna") is None  # left to the others
    sample = f"__ ERROR collecting tests/a.py __\nImportError: {MESSAGE}\n__ ERROR collecting tests/b.py __\nboom\n"
    assert set(refused_at_collection(sample)) == {"tests/a.py"}  # b failed for another reason


# A pytest process collecting every module (~5 s of CPU): in the whole suite, as CI runs it.
@pytest.mark.slow
def test_collecting_the_modules_that_run_no_model_imports_no_torch():
    modules = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py"))
    assert TORCH_MODULES <= set(modules), sorted(TORCH_MODULES - set(modules))  # none renamed or gone
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "tests.torchless"]
        + ["-p", "no:cacheprovider", *modules],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    refused = refused_at_collection(done.stdout)
    assert "collected" in done.stdout.splitlines()[-1], done.stdout[-3000:] + done.stderr[-3000:]
    # A module not listed imports torch: move the import into its tests (or list it, if it runs a model).
    unlisted = sorted(set(refused) - TORCH_MODULES)
    assert unlisted == [], f"{unlisted} import torch when collected:" + "".join(
        f"\n{path}: {refused[path][-1200:]}" for path in unlisted
    )
    # A listed module that no longer imports torch: take it off the list, the check then covers it.
    assert sorted(TORCH_MODULES - set(refused)) == []
