"""Energy over the timed window: joules per effective token. Torch-free (the tuner asks
`energy_meter(...).available` before any trial, to refuse `--objective tokens_per_joule`).

    CUDA  NVML's nvmlDeviceGetTotalEnergyConsumption: millijoules since the driver loaded, the
          whole GPU's (Volta and newer). Read after the synchronize that opens the window and
          after the one that closes it, so the energy is that of the window's finished work.
          A MIG slice has no counter of its own (NVML answers NOT_SUPPORTED for its handle;
          the parent's counter is the whole GPU's, shared with the other slices): null.
    CPU   RAPL through /sys/class/powercap/intel-rapl:N/energy_uj (AMD's too, on kernels
          since 5.8): microjoules of each CPU package, wrapping to 0 past max_energy_range_uj.
          Since CVE-2020-8694 (Platypus) energy_uj is readable by root only on most systems.
    Both are whole-device counters: work of other processes on the same GPU or CPU package
    counts too (said in `source`). Where no counter can be read the figures are null and
    `note` says why (`NoEnergyMeter`: a null object, no branches in the loop).

Resolution: a counter read at both ends of a window is off by up to one update period at
each. NVML's energy counter is updated every 10-100 ms (coarser on some GPUs; its power
readings are averages over windows of their own, and NVIDIA documents no period), so a
window under NVML_MIN_WINDOW_S, 5 s (a 2 x 100 ms error is 4 % of it), has no energy figure
and `note` says why; `search --objective tokens_per_joule` times every window that long.
RAPL's counters are updated about every millisecond: RAPL_MIN_WINDOW_S, 0.1 s.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

NVML_DEVICE = "nvml-device"  # the whole GPU's counter: other processes on it count too
RAPL_PACKAGE = "rapl-package"  # every CPU package's counter: other processes count too
POWERCAP = Path("/sys/class/powercap")
NVML_MIN_WINDOW_S = 5.0  # see the module docstring: the counter's update period, at both ends
RAPL_MIN_WINDOW_S = 0.1


class EnergyMeter(Protocol):
    source: str | None
    note: str | None  # why there is no reading; None when there is one
    min_window_s: float  # the shortest window whose energy the counter resolves

    @property
    def available(self) -> bool: ...

    def start(self) -> Any: ...

    def joules_since(self, start: Any) -> float | None: ...


@dataclass
class NoEnergyMeter:
    """No energy counter here; `note` says why."""

    note: str
    source: str | None = None
    min_window_s: float = 0.0

    @property
    def available(self) -> bool:
        return False

    def start(self) -> None:
        return None

    def joules_since(self, start: Any) -> None:
        return None


class NvmlEnergyMeter:
    """A GPU's cumulative energy counter, in millijoules."""

    source = NVML_DEVICE
    note = None
    min_window_s = NVML_MIN_WINDOW_S

    def __init__(self, pynvml: Any, handle: Any) -> None:
        self._pynvml, self._handle = pynvml, handle

    @property
    def available(self) -> bool:
        return True

    def _millijoules(self) -> int:
        return int(self._pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))

    def start(self) -> int:
        return self._millijoules()

    def joules_since(self, start: int) -> float:
        return (self._millijoules() - start) / 1000.0  # mJ -> J


@dataclass(frozen=True)
class RaplZone:
    energy: Path  # .../energy_uj
    max_range_uj: int  # the counter wraps to 0 past this


class RaplEnergyMeter:
    """The CPU packages' RAPL counters (microjoules), summed; each wraps on its own."""

    source = RAPL_PACKAGE
    note = None
    min_window_s = RAPL_MIN_WINDOW_S

    def __init__(self, zones: list[RaplZone]) -> None:
        self.zones = zones

    @property
    def available(self) -> bool:
        return True

    def start(self) -> list[int]:
        return [int(z.energy.read_text()) for z in self.zones]

    def joules_since(self, start: list[int]) -> float:
        total_uj = 0
        for zone, before in zip(self.zones, start):
            total_uj += wrapped_delta(before, int(zone.energy.read_text()), zone.max_range_uj)
        return total_uj / 1e6  # uJ -> J


def wrapped_delta(before: int, after: int, max_range: int) -> int:
    """after - before for a counter that runs 0..max_range and then starts again at 0 (one wrap
    at most: at 200 W a typical 262,143 J range takes over 20 minutes, a timed window seconds)."""
    return after - before if after >= before else after + (max_range + 1) - before


# --- which meter ----------------------------------------------------------------------------------


def energy_meter(kind: str, uuid: str | None = None, powercap: Path | None = None) -> EnergyMeter:
    """The energy meter of a device: NVML's for a GPU (by UUID), RAPL's for the CPU, else a
    NoEnergyMeter with the reason."""
    return nvml_meter(uuid) if kind == "cuda" else rapl_meter(powercap)


def nvml_meter(uuid: str | None) -> EnergyMeter:
    from autotune.device.nvml import load_nvml, nvml_handle

    pynvml = load_nvml()
    if pynvml is None:
        return NoEnergyMeter("no NVML here: the GPU's energy counter cannot be read")
    if uuid and uuid.startswith("MIG-"):
        return NoEnergyMeter(
            "a MIG slice has no energy counter of its own (NVML's counts the whole GPU, shared with other slices)"
        )
    handle = nvml_handle(uuid)
    if handle is None:
        return NoEnergyMeter(f"NVML does not know the GPU {uuid}")
    try:
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    except pynvml.NVMLError_NotSupported:
        return NoEnergyMeter("this GPU has no total-energy counter (NVML: not supported; it needs Volta or newer)")
    except pynvml.NVMLError as exc:
        return NoEnergyMeter(f"NVML cannot read the GPU's energy counter ({exc})")
    return NvmlEnergyMeter(pynvml, handle)


def rapl_meter(powercap: Path | None = None) -> EnergyMeter:
    """The top-level RAPL zones (one per CPU package; their subzones, core and dram, are parts
    of them and are not added again)."""
    powercap = powercap or POWERCAP
    if not powercap.is_dir():
        return NoEnergyMeter(f"no RAPL on this machine ({powercap} does not exist)")
    packages = sorted(p for p in powercap.glob("intel-rapl:*") if p.name.count(":") == 1)
    if not packages:
        return NoEnergyMeter(f"no RAPL package zone under {powercap}")
    zones = []
    for package in packages:
        try:
            int((package / "energy_uj").read_text())
            zones.append(RaplZone(package / "energy_uj", int((package / "max_energy_range_uj").read_text())))
        except PermissionError:
            return NoEnergyMeter(
                f"{package / 'energy_uj'} is readable by root only (since CVE-2020-8694): "
                "run as root, or make it readable, to measure energy"
            )
        except (OSError, ValueError) as exc:
            return NoEnergyMeter(f"cannot read {package}: {exc}")
    return RaplEnergyMeter(zones)


def window_energy(meter: EnergyMeter, joules: float | None, wall_s: float) -> tuple[float | None, str | None]:
    """(joules, note) of a timed window: none from a window shorter than the counter resolves."""
    if joules is not None and wall_s < meter.min_window_s:
        return None, (
            f"the timed window lasted {wall_s:.1f} s, under the {meter.min_window_s:g} s the {meter.source} counter "
            "needs for a figure within a few percent (it is updated every 10-100 ms): --min-time "
            f"{meter.min_window_s:g} or longer gives one"
        )
    return joules, meter.note


def joules_per_token(joules: float | None, tokens: int) -> float | None:
    return joules / tokens if joules is not None and tokens > 0 else None


def tokens_per_joule(joules_per_token_value: float | None) -> float | None:
    return 1.0 / joules_per_token_value if joules_per_token_value else None
