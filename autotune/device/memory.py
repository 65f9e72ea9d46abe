"""Host memory: the CPU analogue of GPU memory, read from /proc."""

from __future__ import annotations

import os
import resource


def peak_rss_bytes() -> int:
    """This process's peak resident set size (VmHWM), the CPU analogue of peak GPU memory."""
    try:
        with open("/proc/self/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def group_rss_bytes(pgid: int) -> int:
    """Resident memory of every process in the group (a trial and its DataLoader workers)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:  # field 5 of stat: process group id
                total += int(fields[21]) * os.sysconf("SC_PAGE_SIZE")  # field 24: rss in pages
        except (OSError, IndexError, ValueError):
            continue
    return total


def total_host_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
