"""`autotune doctor`: can this machine run a study, and what will it measure?"""

from __future__ import annotations

import sys

import click

from autotune.cli._options import CONTEXT_SETTINGS, emit_json, json_option, settings_options
from autotune.search.settings import SearchSettings


@click.command(context_settings=CONTEXT_SETTINGS)
@settings_options(SearchSettings, "device")
@json_option
def doctor(device: str, as_json: bool) -> None:
    """Check this machine in a few seconds: versions (torch, CUDA, driver, NVML), the GPU, its
    memory and MIG mode, whether it runs in a container (which peak-memory figure trials will
    read), whether torch.compile works, which SDPA backends run in bfloat16 and float16 at
    GPT-2's shape, and the peak FLOPs MFU divides by. Exit 1 when something would fail."""
    from autotune.measure.doctor import run_doctor
    from autotune.present.summaries import doctor_text

    report = run_doctor(device)
    if as_json:
        emit_json(report.to_dict())
    else:
        click.echo(doctor_text(report.to_dict()))
    sys.exit(0 if report.ok else 1)
