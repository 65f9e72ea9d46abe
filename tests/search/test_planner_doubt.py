"""The planner on landscapes its experts' model cannot express (issue A): an interaction nobody
wrote a column for is learnt from the measurements; one bad reading does not move the model for
good; the stop rule refuses to stop while the model mispredicts its own trials; a best at the
memory edge is measured, not excluded. Each test fails on the planner of before (a log-additive
model alone, MIN_FIT as a hard gate)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from optuna.trial import create_trial

from autotune.config import TrainConfig
from autotune.measure import outcomes
from autotune.search import planner as planner_module
from autotune.search.planner import config_key
from autotune.study.record import TrialRecord
from tests.search.test_planner import make_planner, truth_peak

GiB = 2**30
ROOMY = 80 * GiB  # every configuration of these tests fits, but the edge test's

BASE = TrainConfig(
    amp_dtype="bfloat16", sdpa_backend="flash", compile_mode="default", batching="packed", token_budget=32768
).to_dict()


def measured(
    number: int, changes: dict, tps: float, *, limit: int = ROOMY, unstable: bool = False, peak_scale: float = 1.0
) -> TrialRecord:
    """A finished `ok` trial of BASE with `changes`, at `tps` tokens/s, its peak `peak_scale` x the truth's."""
    c = {**BASE, **changes}
    peak = int(truth_peak(c) * peak_scale)
    attrs = {
        "outcome": outcomes.OK,
        "config": c,
        "wall_s": 60.0,
        "tokens_per_sec": tps,
        "peak_memory_bytes": peak,
        "measurement": {"step_time_cv": 0.01, "data_wait_fraction": 0.0, "unstable": unstable},
    }
    frozen = create_trial(value=tps, user_attrs=attrs, constraints={"memory": (peak - limit) / limit})
    frozen.number = number
    return TrialRecord.read(frozen)


def predicted(planner, records, changes: dict) -> float:
    """The planner's mean prediction of BASE with `changes`, in tokens/s."""
    mean, _, _ = planner.fit(records, planner.observe(records))
    return math.exp(mean[planner.index[config_key({**BASE, **changes})]])


# The chunked loss pays 15 % with packed batches and costs 3 % with padded ones: no column of the
# experts' model pairs the two, and a sum of per-knob effects averages them.
INTERACTING = [
    ({}, 500_000.0),
    ({"batching": "padded"}, 460_000.0),
    ({"loss_impl": "chunked", "batching": "padded"}, 446_000.0),
    ({"loss_impl": "chunked"}, 575_000.0),
    ({"num_workers": 4, "batching": "padded"}, 461_000.0),
]


def test_an_interaction_no_prior_names_is_learnt_and_predicted_near_where_it_was_measured():
    planner = make_planner(limit=ROOMY)
    records = [measured(i, c, tps) for i, (c, tps) in enumerate(INTERACTING)]
    # The surprising trial's untried neighbour (workers change no graph, and the loop never waited):
    # predicted near the surprise, where a sum of effects puts it several per cent below.
    assert predicted(planner, records, {"loss_impl": "chunked", "num_workers": 4}) >= 0.97 * 575_000
    # ... and the standard loss with padded batches, measured, stays where it was measured.
    assert predicted(planner, records, {"batching": "padded"}) == pytest.approx(460_000, rel=0.03)


def test_the_stop_rule_refuses_to_stop_while_the_model_mispredicts_its_own_trials(monkeypatch):
    planner = make_planner(limit=ROOMY)
    records = [measured(i, c, tps) for i, (c, tps) in enumerate(INTERACTING)]
    records.append(measured(len(records), {"num_workers": 4}, 501_000.0))  # the last trial improved nothing
    monkeypatch.setattr(planner_module, "STOP_GAIN", 1.0)  # "nothing left worth 100 %": it would stop
    assert planner.stop_reason(records) is None
    assert not planner.check.trusted and planner.check.n == len(records)
    # The same trials on a landscape the sum expresses (the chunked loss -3 % both ways): it stops,
    # and says how well it predicted its own trials.
    additive = [measured(i, c, tps) for i, (c, tps) in enumerate(INTERACTING[:3])]
    additive += [
        measured(3, {"loss_impl": "chunked"}, 485_000.0),
        measured(4, {"num_workers": 4, "batching": "padded"}, 461_000.0),
        measured(5, {"num_workers": 4}, 501_000.0),
    ]
    why = planner.stop_reason(additive)
    assert why is not None and "predicts each of its 5 leading trials from the others within" in why


def test_one_bad_reading_does_not_move_the_model_for_good():
    """A reading 18 % low on a trial every seed takes (a throttled GPU, a noisy neighbour): the
    prediction of its configuration's neighbours stays with the rest of the evidence."""
    planner = make_planner(limit=ROOMY)
    good = [
        ({}, 500_000.0),
        ({"batching": "padded"}, 460_000.0),
        ({"loss_impl": "chunked"}, 485_000.0),
        ({"num_workers": 4, "batching": "padded"}, 461_000.0),
        ({"token_budget": 65536}, 520_000.0),
    ]
    records = [measured(i, c, tps) for i, (c, tps) in enumerate(good)]
    neighbour = {"num_workers": 4, "token_budget": 65536}
    clean = predicted(planner, records, neighbour)
    bad = records + [measured(len(records), {"num_workers": 4}, 0.82 * 501_000, unstable=True)]
    assert predicted(planner, bad, neighbour) >= 0.985 * clean
    assert planner.check.outliers == (len(records),)


def test_a_best_at_the_memory_edge_is_measured_not_excluded():
    """The largest budget that fits sits at the limit, its predicted peak a hair over: a chance to
    fit under one half, and several per cent expected if it does. It is proposed."""
    limit = int(truth_peak({**BASE, "token_budget": 65536}) * 1.01)
    planner = make_planner(limit=limit)
    # Peaks read 2 % high (an allocator's slack): the model puts the largest budget a hair over.
    trials = [({"token_budget": 16384}, 420_000.0), ({}, 470_000.0), ({"num_workers": 4}, 471_000.0)]
    trials += [({"loss_impl": "chunked"}, 400_000.0)]  # the chunked loss, which would fit, costs 15 % here
    records = [measured(i, c, tps, limit=limit, peak_scale=1.02) for i, (c, tps) in enumerate(trials)]
    mean, sd, p_fit = planner.fit(records, planner.observe(records))
    edge = planner.index[config_key({**BASE, "token_budget": 65536})]
    assert p_fit[edge] < planner_module.MIN_FIT  # the memory model doubts it ...
    proposal = planner.propose(records)
    assert proposal.config["token_budget"] == 65536  # ... and it is measured all the same
    assert np.isfinite(proposal.p_fit)
    # Two configurations of the study went over the limit: no more edges, only the likely.
    from tests.search.test_planner import record

    over = [{**BASE, "amp_dtype": "float32", "sdpa_backend": "math", "token_budget": b} for b in (65536, 131072)]
    missed = records + [record(4 + i, c, limit=limit, outcome=outcomes.OOM) for i, c in enumerate(over)]
    assert planner.propose(missed).p_fit >= planner_module.MIN_FIT


def test_a_search_ended_by_its_budget_while_the_model_mispredicts_says_it_did_not_settle():
    from autotune.search.sampler import PlannerSampler
    from autotune.search.stopping import budget_stop

    sampler = PlannerSampler(make_planner(limit=ROOMY))
    records = [measured(i, c, tps) for i, (c, tps) in enumerate(INTERACTING)]
    sampler.planner.stop_reason(records)
    stop = budget_stop(ran=5, n_trials=5, timeout_s=None, doubt=sampler.doubt())
    assert stop.text.startswith(
        "--n-trials reached (5 trials run; not settled: the model predicts each of its 5 leading"
    )
    assert "more than the noise; a longer search may find more" in stop.text


def test_when_nothing_fits_the_planner_stops_instead_of_proposing_the_refused_again():
    """S09: with a limit nothing fits, the likeliest configuration was recorded predicted_over_limit;
    nothing measured since can change that, so it stops saying why (it proposed it 59 times)."""
    from tests.search.test_planner import record

    planner = make_planner(limit=GiB // 4)
    first = planner.propose([])
    refused = record(0, first.config, limit=GiB // 4, outcome=outcomes.PREDICTED_OVER_LIMIT)
    stop = planner.propose([refused])
    assert isinstance(stop, planner_module.Stop), stop
    assert stop.reason.startswith("nothing is likely to fit the memory limit: the likeliest, token_budget=")


def test_a_bad_reading_of_the_best_is_measured_again_not_lost():
    """The best configuration's one reading comes out 40 % low (a stall, a noisy neighbour). It
    counts with a wide noise, and it is proposed again, measured afresh: else the search never
    learns the best's worth and recommends the second (here 2 % worse: four workers gain 2 %)."""
    from autotune.search.planner import REMEASURE, Stop
    from tests.search.test_planner import LIMIT, make_planner, truth_tps

    def truth(c: dict) -> float:
        return truth_tps(c) * (1.02 if c["num_workers"] == 4 else 1.0)

    def reading(number: int, c: dict, tps: float) -> TrialRecord:
        peak = truth_peak(c)
        ok = peak <= LIMIT
        attrs = {"outcome": outcomes.OK if ok else outcomes.OVER_MEMORY_LIMIT, "config": c, "wall_s": 60.0}
        attrs |= {"tokens_per_sec": tps, "peak_memory_bytes": peak}
        attrs["measurement"] = {"step_time_cv": 0.01, "data_wait_fraction": 0.0}
        frozen = create_trial(value=tps, user_attrs=attrs, constraints={"memory": (peak - LIMIT) / LIMIT})
        frozen.number = number
        return TrialRecord.read(frozen)

    planner = make_planner()
    best = max(truth(c) for c in planner.configs if truth_peak(c) <= LIMIT)
    records, planted, stages = [], None, []
    for i in range(30):
        proposal = planner.propose(records)
        if isinstance(proposal, Stop):
            break
        tps = truth(proposal.config)
        if planted is None and tps >= 0.999 * best:
            planted, tps = i, 0.6 * tps
        stages.append(proposal.stage)
        records.append(reading(i, proposal.config, tps))
        if planner.stop_reason(records) is not None:
            break
    assert planted is not None, "the search never proposed the best"
    assert max(r.tokens_per_sec for r in records) >= 0.999 * best
    assert REMEASURE in stages
