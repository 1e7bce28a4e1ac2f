"""The per-worker meta gate: at most N meta runs at once across a server's meta models.

A counting semaphore of N lock files (``slot-<i>``) per tritonserver: a run holds an exclusive
``flock`` on one, released by the kernel when the process dies. Waiting polls (doubling up to
:data:`MAX_POLL_S`) until the deadline, not first-come-first-served (docs/meta_models.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from hloserve.errors import DeadlineExceededError
from hloserve.meta.deadline import Deadline

#: First and longest wait between two attempts to take a slot, seconds.
FIRST_POLL_S = 0.002
MAX_POLL_S = 0.02
_GATE_PREFIX = "hloserve-meta-gate-"


def server_gate_dir(server_pid: int | None = None) -> Path:
    """``<tmp>/hloserve-meta-gate-<pid>`` of a tritonserver (default: this stub's parent)."""
    pid = os.getppid() if server_pid is None else server_pid
    return Path(tempfile.gettempdir()) / f"{_GATE_PREFIX}{pid}"


def remove_stale_gates() -> list[Path]:
    """Delete (and return) the gate directories of servers whose pid is gone."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob(f"{_GATE_PREFIX}*"):
        pid = path.name.removeprefix(_GATE_PREFIX)
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        except PermissionError:
            continue  # alive, another user's
    return removed


class MetaGate:
    """A cross-process counting semaphore of ``slots`` permits: lock files in ``directory``; raises
    ValueError: ``slots`` < 1."""

    def __init__(
        self, directory: Path, slots: int, *, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        if slots < 1:
            raise ValueError(f"meta gate: slots must be >= 1, got {slots}")
        self.directory = Path(directory)
        self.slots = slots
        self._sleep = sleep
        self.directory.mkdir(parents=True, exist_ok=True)

    def try_acquire(self) -> int | None:
        """Take a free slot without waiting: its open, locked file descriptor, or None."""
        for slot in range(self.slots):
            fd = os.open(self.directory / f"slot-{slot}", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            except BaseException:
                os.close(fd)
                raise
            return fd
        return None

    @contextlib.contextmanager
    def permit(self, model: str, deadline: Deadline) -> Iterator[None]:
        """Hold one permit for the ``with`` body, waiting until ``deadline``; raises
        DeadlineExceededError: no permit came free before the deadline (nothing ran)."""
        delay = FIRST_POLL_S
        while (fd := self.try_acquire()) is None:
            left = deadline.remaining_s()
            if left is not None and left <= 0:
                raise DeadlineExceededError(
                    f"model {model!r}: deadline exceeded waiting for the meta gate "
                    f"({self.slots} meta run(s) at once on this worker); nothing ran"
                )
            self._sleep(delay if left is None else min(delay, left))
            delay = min(delay * 2, MAX_POLL_S)
        try:
            yield
        finally:
            os.close(fd)  # closing the only descriptor releases the flock
