"""The reference trials that open every study: the untuned baseline (the seed article's
step 1) and its "everything on" checklist. The summary and the recipe give the best's
speedup over both."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from autotune.config import TrainConfig, usable_cpus
from autotune.errors import UnsupportedConfig
from autotune.knobs.support import DeviceCapabilities, check_supported
from autotune.measure import outcomes
from autotune.study.record import TrialRecord, read_trials
from autotune.study.references import BASELINE, CHECKLIST, REFERENCE_ATTR
from autotune.study.storage import RetryStaleTrial


def baseline_config(seq_len: int) -> TrainConfig:
    """The seed's step 1: fp32 eager, math attention, no workers, no pinning, a fixed batch
    of 8 sequences each padded to the full context."""
    return TrainConfig(
        num_workers=0,
        pin_memory=False,
        token_budget=8 * seq_len,
        batching="fixed",
        amp_dtype="float32",
        compile_mode="none",
        sdpa_backend="math",
        checkpoint_layers=(),
    )


def checklist_config(seq_len: int, caps: DeviceCapabilities) -> tuple[TrainConfig, list[str]]:
    """The seed's "everything on": bf16 (fp16 where bf16 cannot run, float32 on a CPU without
    bf16 instructions), compile, flash, pinned memory, 4 workers, token-budget batching, no
    checkpointing. A knob the device cannot run goes back to its default; the returned notes
    say which."""
    cfg = TrainConfig(
        num_workers=4,
        pin_memory=True,
        token_budget=8 * seq_len,
        batching="padded",
        amp_dtype="bfloat16",
        compile_mode="default",
        sdpa_backend="flash",
        checkpoint_layers=(),
    )
    notes: list[str] = []
    default = TrainConfig()
    for _ in range(len(cfg.to_dict())):
        try:
            check_supported(cfg, caps)
            break
        except UnsupportedConfig as exc:
            if exc.knob == "amp_dtype" and cfg.amp_dtype == "bfloat16":
                cfg = cfg.replace(amp_dtype="float16")
            else:
                cfg = cfg.replace(**{exc.knob: getattr(default, exc.knob)})
            notes.append(f"{exc.knob} changed ({exc.reason})")
    if cfg.amp_dtype == "bfloat16" and not caps.cpu_bf16:
        # It runs, but emulated: a checklist slower than the baseline would make every
        # "speedup vs checklist" a measure of the emulation (11.6x on gpt2-tiny, AVX2).
        cfg = cfg.replace(amp_dtype="float32")
        notes.append("amp_dtype changed (this CPU has no bf16 instructions; emulated bf16 is slower than float32)")
    return cfg, notes


def enqueue_references(study: optuna.Study) -> None:
    for name in (BASELINE, CHECKLIST):
        study.enqueue_trial({}, user_attrs={REFERENCE_ATTR: name}, skip_if_exists=False)


def retry_interrupted_references(study: optuna.Study) -> list[str]:
    """On resume: a reference trial whose every attempt was interrupted (Ctrl-C, SIGTERM) is
    queued once more, as a killed tuner's trial is (`search.run.fail_orphaned_trials`):
    the planner never proposes a reference, so without this the study would never report its
    speedup over it. Once: a retry that is interrupted too is not retried again (Optuna's
    retry history counts the attempts). A reference still waiting, running or finished any
    other way (ok, crashed, timed out: a result) is left alone. Returns the names queued."""
    attempts: dict[str, list[TrialRecord]] = {}
    for record in read_trials(study):
        if record.reference:
            attempts.setdefault(record.reference, []).append(record)
    trials = study.get_trials(deepcopy=False)
    queued = []
    for name, records in attempts.items():
        if not all(r.state is TrialState.FAIL and r.outcome is outcomes.INTERRUPTED for r in records):
            continue
        last = trials[records[-1].number]
        if "failed_trial" in last.system_attrs:  # a retry itself (Optuna's mark): it had its second chance
            continue
        RetryStaleTrial(max_retry=1)(study, last)
        queued.append(name)
    return queued


def reference_config(
    name: str, seq_len: int, caps: DeviceCapabilities, world_size: int = 1
) -> tuple[TrainConfig, list[str]]:
    """The configuration of reference trial `name`, and notes on knobs the device changed. With
    several ranks, each is trained by DDP at its defaults (what `torchrun` and a plain
    `DistributedDataParallel(model)` give), the checklist's workers cut to what leaves each rank
    a CPU of its own."""
    cfg, notes = (baseline_config(seq_len), []) if name == BASELINE else checklist_config(seq_len, caps)
    if world_size > 1:
        cfg = cfg.replace(parallelism="ddp")
        fitting = max(0, usable_cpus() // world_size - 1)
        if cfg.num_workers > fitting:
            cfg = cfg.with_overrides({"num_workers": str(fitting)})  # prefetch and persistence reset with it
            notes.append(f"num_workers changed ({world_size} ranks x (workers + 1) must fit {usable_cpus()} CPUs)")
    return cfg, notes
