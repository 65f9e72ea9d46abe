"""The TCP sockets a process listens on, read from /proc (Linux): for the tests that check a
launch listens on loopback only (issue D, M09). Imports nothing of autotune's: the ranks of a
launch import it too."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def listening_addresses(inodes: set[str]) -> dict[int, set[str]]:
    """{port: addresses} of the listening TCP sockets (IPv4 and IPv6) whose inodes are given:
    "127.0.0.1", "every interface" (0.0.0.0 or ::), or the address as /proc shows it."""
    found: dict[int, set[str]] = {}
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                address, port = fields[1].split(":")
                shown = (
                    "127.0.0.1" if address == "0100007F" else "every interface" if set(address) == {"0"} else address
                )
                found.setdefault(int(port, 16), set()).add(shown)
    return found


def socket_inodes(*pids: int) -> set[str]:
    """The inodes of the sockets the processes `pids` hold open."""
    inodes = set()
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
    return inodes
