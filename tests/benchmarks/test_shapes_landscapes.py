"""benchmarks/shapes/: each shipped landscape loads as a sweep (_replay.Sweep.load), holds every
configuration of its space, and has the mechanism it was built around. Slow: each file takes
about a second to load and enumerate."""

from __future__ import annotations

import functools
import statistics
import sys

import pytest

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

from _common import config_key, enumerate_space  # noqa: E402
from _replay import Sweep, best_feasible, measured, memory_limit  # noqa: E402

# One worker loads each landscape once (functools.cache, below), for every test that reads it:
# split over the two, both loaded most of them (~14 s of CPU to load them all, ~9 s to enumerate).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("shapes-landscapes")]

SHAPES = ROOT / "benchmarks" / "shapes"
NAMES = ("interacting", "edge", "heavy-tail", "host-bound", "pre-ampere")


@functools.cache
def sweep(name: str) -> Sweep:
    return Sweep.load(SHAPES / f"{name}.json.gz")


def runs(s: Sweep) -> list[dict]:
    return [r for r in s.records if measured(r)]


def best(records: list[dict]) -> dict:
    return max(records, key=lambda r: r["tokens_per_sec"])


def twin(s: Sweep, config: dict, **knobs) -> dict | None:
    """The record of `config` with `knobs` changed, if it was measured."""
    rec = s.table.get(config_key({**config, **knobs}))
    return rec if rec is not None and measured(rec) else None


def ratio(s: Sweep, knob: str, a, b, **where) -> float:
    """The median, over the measured configurations with knob=a whose other knobs are as `where`
    says (a value, or a tuple of values), of their tokens/s over their twin's with knob=b."""
    out = []
    for r in runs(s):
        c = r["config"]
        held = all(c[k] in (v if isinstance(v, tuple) else (v,)) for k, v in where.items())
        if c[knob] == a and held and (t := twin(s, c, **{knob: b})):
            out.append(r["tokens_per_sec"] / t["tokens_per_sec"])
    return statistics.median(out)


@pytest.mark.parametrize("name", NAMES)
def test_a_shipped_landscape_is_a_sweep_of_every_configuration_of_its_space(name):
    assert (SHAPES / f"{name}.json.gz").stat().st_size < 1.5 * 2**20
    s = sweep(name)
    assert s.meta["synthetic"] is True and s.meta["landscape"]["name"] == name
    assert {config_key(cfg) for _, cfg in enumerate_space(s.space)} == set(s.table)
    assert 2000 <= len(s.records) <= 15000
    assert runs(s) and all(r["peak_memory_bytes"] > 0 for r in runs(s))


def test_interacting_max_autotune_pays_only_in_a_whole_model_graph_and_cudnn_only_eager():
    s = sweep("interacting")
    top = best(runs(s))["config"]
    assert (top["compile_mode"], top["compile_scope"]) == ("max-autotune", "model")
    # max-autotune against default at the same scope: loses 3-6 % per block graph, gains with one graph
    for scope in ("blocks", "blocks+head"):
        assert 0.93 < ratio(s, "compile_mode", "max-autotune", "default", compile_scope=scope) < 0.97
    assert ratio(s, "compile_mode", "max-autotune", "default", compile_scope="model") > 1.03
    # cuDNN attention: the fastest eager kernel, not the fastest compiled (it breaks the graph)
    assert best([r for r in runs(s) if r["config"]["compile_mode"] == "none"])["config"]["sdpa_backend"] == "cudnn"
    compiled = ("default", "max-autotune", "reduce-overhead")
    assert best([r for r in runs(s) if r["config"]["compile_mode"] in compiled])["config"]["sdpa_backend"] != "cudnn"
    assert ratio(s, "sdpa_backend", "cudnn", "flash", compile_mode="none") > 1.01
    assert ratio(s, "sdpa_backend", "cudnn", "flash", compile_mode=compiled) < 0.98
    # a whole-model graph loses more to padded batches than a block graph
    padded = ratio(s, "compile_scope", "model", "blocks", batching="padded", compile_mode="default")
    assert padded < ratio(s, "compile_scope", "model", "blocks", batching="packed", compile_mode="default") - 0.03


@pytest.mark.parametrize("quantile", [0.3, 0.5, 0.8, 0.95])
def test_edge_the_best_under_each_limit_is_the_largest_budget_that_fits_just_under_it(quantile):
    s = sweep("edge")
    limit = memory_limit(s.records, quantile)
    top = best_feasible(s.records, limit)
    assert 0.01 <= (limit - top["peak_memory_bytes"]) / limit <= 0.03
    budgets = sorted(s.space.dimensions["token_budget"].choices)
    family = [twin(s, top["config"], token_budget=b) for b in budgets]
    fits = [r for r in family if r is not None and r["peak_memory_bytes"] <= limit]
    assert fits[-1] is top  # the next budget up does not fit
    assert all(a["tokens_per_sec"] < b["tokens_per_sec"] for a, b in zip(fits, fits[1:]))  # rising to the edge


def test_heavy_tail_some_records_are_low_and_some_runs_failed():
    s = sweep("heavy-tail")
    failed = [r for r in s.records if r["outcome"] in ("crashed", "timeout")]
    assert {r["outcome"] for r in failed} == {"crashed", "timeout"}
    assert all(r["tokens_per_sec"] is None and r["wall_s"] > 0 for r in failed)
    assert 0.005 < len(failed) / len(s.records) < 0.03

    # twins that differ only in the (here harmless) worker count: a low record stands out
    def outliers(name):
        s = sweep(name)
        pairs = [(r, twin(s, r["config"], num_workers=0)) for r in runs(s) if r["config"]["num_workers"] == 4]
        rs = [r["tokens_per_sec"] / t["tokens_per_sec"] for r, t in pairs if t is not None]
        return sum(not 0.9 < x < 1.1 for x in rs) / len(rs)

    assert 0.05 < outliers("heavy-tail") < 0.16
    assert outliers("interacting") < 0.01


def test_host_bound_throughput_peaks_at_a_middle_worker_count():
    s = sweep("host-bound")
    top = best(runs(s))["config"]
    workers = sorted(s.space.dimensions["num_workers"].choices)
    curve = {w: twin(s, top, num_workers=w) for w in workers if w > 0}
    rates = [curve[w]["tokens_per_sec"] for w in workers if w > 0]
    peak = rates.index(max(rates))
    assert 0 < peak < len(rates) - 1 and rates[-1] < 0.8 * max(rates)
    assert max(r["data_wait_fraction"] for r in runs(s)) > 0.5


def test_pre_ampere_runs_float16_only_and_no_flash_or_cudnn_attention():
    s = sweep("pre-ampere")
    assert s.meta["device"]["compute_capability"] == "7.0"
    refused = [r for r in s.records if r["config"]["amp_dtype"] in ("bfloat16", "tf32")]
    refused += [r for r in s.records if r["config"]["sdpa_backend"] in ("flash", "cudnn")]
    assert refused and all(r["outcome"] == "unsupported" for r in refused)
    assert best(runs(s))["config"]["amp_dtype"] == "float16"
