"""Host memory: the CPU analogue of GPU memory, read from /proc.

A run's host memory is its whole process tree's: the run itself, its DataLoader workers, and
whatever those start. Summing resident set sizes (RSS) over-counts it badly: a forked worker
shares its parent's pages copy-on-write, and each process's RSS counts every shared page in
full (4 workers of a 500 MB trial would "use" 2.5 GB before touching anything). The
proportional set size (PSS: each shared page divided among its sharers) sums correctly, but
reading it (/proc/PID/smaps_rollup) walks the page tables, ~10 ms for a 500 MB process. So
`ProcessTreeMemory` samples cheap RSS often and corrects it with each process's shared share
(RSS - PSS), re-read about once a second: a worker that allocates 900 MB shows at once, the
shared libraries and copy-on-write pages are counted once."""

from __future__ import annotations

import os
import resource
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

_PAGE = os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    """This process's peak resident set size (VmHWM), the CPU analogue of peak GPU memory."""
    return peak_rss_of(os.getpid()) or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def peak_rss_of(pid: int) -> int | None:
    """A process's peak resident set size (VmHWM), or None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def reset_peak_rss(pid: int) -> bool:
    """Reset a process's peak resident set size (VmHWM) to its current RSS, so the next
    reading is the peak of what follows (Linux >= 4.0: writing 5 to /proc/PID/clear_refs).
    False where the kernel or the permissions refuse it."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return True
    except OSError:
        return False


def group_rss_bytes(pgid: int) -> int:
    """Resident memory of every process in the group (a trial and its DataLoader workers)."""
    total = 0
    for pid in _all_pids():
        stat = read_stat(pid)
        if stat is not None and stat.pgid == pgid:
            total += rss_bytes(pid) or 0
    return total


def total_host_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def host_memory_cap() -> int:
    """The most host memory this process's tree may have: the machine's RAM, or less where a
    cgroup (a container, a systemd or Slurm job) limits it (v2 memory.max, v1 limit_in_bytes)."""
    cap = total_host_memory()
    for path in _cgroup_limit_files():
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            cap = min(cap, int(text))
    return cap


def _cgroup_limit_files() -> list[str]:
    files = ["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"]
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return files
    for line in lines:
        _, controllers, where = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        if controllers == "" and where:
            files.append(f"/sys/fs/cgroup{where.rstrip('/')}/memory.max")
        elif "memory" in controllers.split(","):
            files.append(f"/sys/fs/cgroup/memory{where.rstrip('/')}/memory.limit_in_bytes")
    return files


# --- processes ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/PID/stat that autotune reads."""

    pid: int
    state: str  # R, S, D, Z (zombie), ...
    ppid: int
    pgid: int
    start_time: int  # clock ticks after boot: with the pid, identifies a process (pids are reused)


def read_stat(pid: int) -> ProcStat | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the name, in parentheses, may hold anything
        return ProcStat(pid, fields[0], int(fields[1]), int(fields[2]), int(fields[19]))
    except (OSError, IndexError, ValueError):
        return None


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (children, their children, ...), by parent pid. Read from
    /proc/PID/task/*/children where the kernel has it (cheap), else from a scan of /proc."""
    found: list[int] = []
    seen = {pid}
    frontier = [pid]
    by_parent: dict[int, list[int]] | None = None
    while frontier:
        parent = frontier.pop()
        kids = _children(parent)
        if kids is None:  # no /proc/PID/task/*/children: one scan of /proc serves the whole walk
            if by_parent is None:
                by_parent = _children_by_parent()
            kids = by_parent.get(parent, [])
        for kid in kids:
            if kid not in seen:
                seen.add(kid)
                found.append(kid)
                frontier.append(kid)
    return found


def _children(pid: int) -> list[int] | None:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []  # gone
    kids: list[int] = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f:
                kids.extend(int(k) for k in f.read().split())
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # the thread ended
            return None  # the kernel has no children file
        except (OSError, ValueError):
            continue
    return kids


def _children_by_parent() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for pid in _all_pids():
        stat = read_stat(pid)
        if stat is not None:
            out.setdefault(stat.ppid, []).append(pid)
    return out


def _all_pids() -> Iterator[int]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            yield int(entry)


def rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def pss_bytes(pid: int) -> int | None:
    """Proportional set size: resident pages, each shared one divided among its sharers."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


# --- the sampler ---------------------------------------------------------------------------------


class ProcessTreeMemory:
    """The peak host memory of a process and everything below it, sampled.

    Use as a context manager around the run (a thread samples every `interval_s`), or call
    `sample()` from a loop of your own. `peak_bytes` is the largest tree total seen, and never
    less than the root's own peak RSS (VmHWM), which the kernel tracks exactly: whatever the
    root had resident, the tree had at least as much in memory at that moment.

    Each sample: the RSS of each process of the tree, less its shared share (RSS - PSS) as last
    read, re-read every `pss_refresh_s` and when a process first appears. A process alone (no
    descendants) shares nothing with the tree: its RSS is taken as it is, and no PSS is read.
    Cost: ~1 ms a sample on a loaded 2-core VM (10 Hz: ~1% of a core), plus ~10 ms per 500 MB
    process for each PSS read (once a second, only while there are workers)."""

    def __init__(self, root: int | None = None, *, interval_s: float = 0.1, pss_refresh_s: float = 1.0) -> None:
        self.root = os.getpid() if root is None else root
        self.interval_s = interval_s
        self.pss_refresh_s = pss_refresh_s
        self.sampled_peak = 0
        self.own_peak_valid = True  # the root's VmHWM counts from the last restart_peak()
        self.max_processes = 1
        self._shared: dict[tuple[int, int], tuple[int, float]] = {}  # (pid, start) -> (RSS - PSS, when read)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> "ProcessTreeMemory":
        self.sample()
        self._thread = threading.Thread(target=self._run, name="autotune-host-memory", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.sample()

    @property
    def peak_bytes(self) -> int:
        """The peak since the start or the last `restart_peak()`: the largest sample, or the
        root's own peak RSS if larger (when its VmHWM could be reset at the restart)."""
        own = (peak_rss_of(self.root) or 0) if self.own_peak_valid else 0
        return max(self.sampled_peak, own)

    def restart_peak(self) -> None:
        """Count the peak from now on (one phase of a run: its warm-up, its timed window).
        The root's VmHWM is reset with it; where the kernel refuses that, the phase's peak is
        the sampled one alone (it can miss a spike shorter than `interval_s`)."""
        self.own_peak_valid = reset_peak_rss(self.root)
        with self._lock:
            self.sampled_peak = 0
        self.sample()

    def sample(self) -> int:
        """One reading of the tree's memory now; updates the peak. 0 when the root is gone."""
        with self._lock:
            pids = [self.root, *descendants(self.root)]
            self.max_processes = max(self.max_processes, len(pids))
            now = time.monotonic()
            total = 0
            alone = len(pids) == 1
            live: set[tuple[int, int]] = set()
            for pid in pids:
                rss = rss_bytes(pid)
                if rss is None:
                    continue
                if alone:
                    total += rss
                    continue
                stat = read_stat(pid)
                key = (pid, stat.start_time if stat else 0)
                live.add(key)
                shared, when = self._shared.get(key, (None, 0.0))
                if shared is None or now - when >= self.pss_refresh_s:
                    pss = pss_bytes(pid)
                    shared = max(0, rss - pss) if pss is not None else 0
                    self._shared[key] = (shared, now)
                total += max(0, rss - shared)
            if not alone:
                self._shared = {k: v for k, v in self._shared.items() if k in live}
            self.sampled_peak = max(self.sampled_peak, total)
            return total

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - a failed reading must never stop the run it watches
                continue


def oom_kill_count(vmstat: str = "/proc/vmstat") -> int | None:
    """How many processes the kernel's out-of-memory killer has killed since boot (every memory
    cgroup's kills included: /proc/vmstat's oom_kill, Linux 4.13 and newer); None where unreadable.
    Read before and after a trial that died of SIGKILL, it tells the OOM killer from a kill -9."""
    try:
        with open(vmstat, encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


def oom_killed_since(kills_before: int | None) -> bool | None:
    """Whether the kernel's OOM killer killed a process since `oom_kill_count` read `kills_before`;
    None where either count is unknown. What `outcomes.classify_exit` needs to tell the OOM
    killer's SIGKILL from someone's kill -9, for a trial's process and a launch's ranks alike."""
    kills_after = oom_kill_count()
    return None if kills_before is None or kills_after is None else kills_after > kills_before
