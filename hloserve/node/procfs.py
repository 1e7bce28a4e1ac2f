"""A process session's members, kill and listening ports from ``/proc`` (Linux; proc(5))."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator, Sequence
from pathlib import Path


def session_processes(session: int) -> Iterator[tuple[int, str, list[str]]]:
    """``(pid, /proc/<pid>/stat line, command line words)`` of every process, zombies included,
    whose process group or session is ``session`` (a zombie's command line is empty)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            group, sid = _fields(stat)[2:4]
            if session not in (int(group), int(sid)):
                continue
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        yield pid, stat, [a.decode(errors="replace") for a in argv if a]


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, process group, session) of ``pid`` from ``/proc/<pid>/stat``, or None if gone."""
    try:
        fields = _fields(Path(f"/proc/{pid}/stat").read_text())
    except OSError:
        return None
    return fields[0], int(fields[2]), int(fields[3])


def _fields(stat: str) -> list[str]:
    return stat[stat.rindex(")") + 2 :].split()


def session_pids(session: int) -> list[int]:
    """Live (non-zombie) processes whose process group or session is ``session``."""
    return [pid for pid, stat, _ in session_processes(session) if _fields(stat)[0] != "Z"]


def kill_session(session: int, grace_s: float) -> list[int]:
    """SIGKILL every process of ``session``; return those still alive after ``grace_s`` + 8 s."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(session, signal.SIGKILL)
    deadline = time.monotonic() + grace_s + 8.0
    pids = session_pids(session)
    for _ in range(int((grace_s + 8.0) / 0.05) + 1):
        if not pids or time.monotonic() > deadline:
            break
        for pid in pids:  # processes that left the group but not the session
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
        pids = session_pids(session)
    return pids


def listening_ports(pids: Sequence[int]) -> set[int]:
    """TCP ports in LISTEN state whose sockets are open in one of ``pids`` (``/proc/net``)."""
    inodes: set[str] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as f:
            next(f, None)
            for line in f:
                cols = line.split()
                if len(cols) > 9 and cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                    ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def die_with_parent() -> None:
    """In the child before exec: ask Linux to SIGTERM it when the parent thread dies."""
    import ctypes

    pr_set_pdeathsig = 1  # <linux/prctl.h>
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM))
