"""The channel between front instances and the runtime (docs/serving.md, "Front -> runtime (the
channel)"): JSON messages on an abstract ``SOCK_SEQPACKET`` socket, tensors in shared memory
(:class:`Arena`, :class:`Segment`), names from :func:`server_key` so servers never meet."""

from __future__ import annotations

import bisect
import contextlib
import json
import mmap
import os
import select
import socket
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hloserve.errors import ChannelClosed

SHM_DIR = Path("/dev/shm")
PREFIX = "hloserve.channel"
#: largest control message (one datagram), bytes
MAX_MESSAGE_BYTES = 1 << 20
#: a front instance's arena, bytes (sparse: pages cost memory once written)
DEFAULT_ARENA_BYTES = 64 << 20
#: alignment of every arena allocation, bytes (a cache line)
ALIGN = 64


def server_key() -> str:
    """``<tritonserver pid>-<pid namespace inode>``: the same in every stub of one server."""
    try:
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        ns = 0
    return f"{os.getppid()}-{ns}"


def address(runtime_model: str, key: str | None = None) -> str:
    """The abstract Unix socket address of ``runtime_model``'s channel (leading NUL)."""
    return f"\0{PREFIX}-{key or server_key()}-{runtime_model}"


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    """Send one message (JSON, one datagram)."""
    data = json.dumps(message, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE_BYTES:
        raise ValueError(f"channel message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    sock.sendall(data)


def receive(sock: socket.socket) -> dict[str, Any]:
    """Receive one message; ChannelClosed when the peer closed the connection (or it broke)."""
    try:
        data = sock.recv(MAX_MESSAGE_BYTES)
    except OSError as exc:
        raise ChannelClosed(str(exc)) from None
    if not data:
        raise ChannelClosed("the peer closed the channel")
    return json.loads(data)


def receive_ready(sock: socket.socket) -> list[dict[str, Any]]:
    """Every message waiting on readable ``sock`` (at least one, at most 64); ChannelClosed
    when the peer closed and nothing is left."""
    messages: list[dict[str, Any]] = []
    while True:
        try:
            data = sock.recv(MAX_MESSAGE_BYTES, socket.MSG_DONTWAIT)
        except BlockingIOError:
            break
        except OSError as exc:
            if messages:
                break
            raise ChannelClosed(str(exc)) from None
        if not data:
            if messages:
                break  # the close is seen on the next call
            raise ChannelClosed("the peer closed the channel")
        messages.append(json.loads(data))
        if len(messages) >= 64:  # bounded: other connections get their turn
            break
    return messages


def listen(addr: str) -> socket.socket:
    """A listening ``SOCK_SEQPACKET`` socket at ``addr``; OSError when it is in use."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.bind(addr)
    sock.listen(256)
    return sock


def connect(addr: str, timeout: float | None = None) -> socket.socket:
    """A connection to the runtime at ``addr``; OSError when nobody listens."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(timeout)
    try:
        sock.connect(addr)
    except OSError:
        sock.close()
        raise
    sock.settimeout(None)
    return sock


def peer_uid(sock: socket.socket) -> int:
    """The user id of the process at the other end (``SO_PEERCRED``)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


class Segment:
    """A shared-memory file in :data:`SHM_DIR`, mapped read-write; ``create``: make it (mode
    0600, must not exist) at ``size`` bytes."""

    def __init__(self, name: str, size: int = 0, *, create: bool = False) -> None:
        if "/" in name or not name.startswith(PREFIX + "-"):
            raise ValueError(f"not a channel segment name: {name!r}")
        self.name = name
        self.path = SHM_DIR / name
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(self.path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, max(size, 1))
            self.size = os.fstat(fd).st_size
            self.mmap = mmap.mmap(fd, self.size)
        finally:
            os.close(fd)
        self.buffer = memoryview(self.mmap)

    def close(self) -> None:
        """Unmap (views still held elsewhere keep the memory until they are dropped)."""
        with contextlib.suppress(BufferError):  # an array still views it: it keeps the mapping
            self.buffer.release()
            self.mmap.close()

    def unlink(self) -> None:
        """Remove the file (mappings stay valid)."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of :data:`ALIGN` (at least one)."""
    return max(ALIGN, -(-nbytes // ALIGN) * ALIGN)


class Arena:
    """A front instance's arena: a :class:`Segment` and a first-fit allocator (thread-safe;
    offsets are multiples of :data:`ALIGN`)."""

    def __init__(self, segment: Segment) -> None:
        self.segment = segment
        self._lock = threading.Lock()
        self._free: list[tuple[int, int]] = [(0, segment.size)]  # (offset, size), by offset

    def allocate(self, nbytes: int) -> int | None:
        """Offset of ``nbytes`` free bytes, or None when no free run holds them."""
        size = aligned(nbytes)
        with self._lock:
            for i, (offset, run) in enumerate(self._free):
                if run >= size:
                    if run == size:
                        del self._free[i]
                    else:
                        self._free[i] = (offset + size, run - size)
                    return offset
        return None

    def free(self, offset: int, nbytes: int) -> None:
        """Give back what :meth:`allocate` returned for ``nbytes``."""
        size = aligned(nbytes)
        with self._lock:
            i = bisect.bisect_left(self._free, (offset, 0))
            self._free.insert(i, (offset, size))
            # merge with the neighbours
            if i + 1 < len(self._free) and offset + size == self._free[i + 1][0]:
                self._free[i] = (offset, size + self._free[i + 1][1])
                del self._free[i + 1]
            if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == offset:
                self._free[i - 1] = (self._free[i - 1][0], self._free[i - 1][1] + self._free[i][1])
                del self._free[i]

    @property
    def free_bytes(self) -> int:
        with self._lock:
            return sum(run for _, run in self._free)


@dataclass(frozen=True)
class SegmentName:
    """The parts of a channel segment's file name: ``hloserve-<server>-<ns>-<pid>-<n>``."""

    server_pid: int
    namespace: int
    owner_pid: int

    @classmethod
    def parse(cls, name: str) -> SegmentName | None:
        parts = name.split("-")
        if len(parts) != 5 or parts[0] != PREFIX or not all(p.isdigit() for p in parts[1:]):
            return None
        return cls(int(parts[1]), int(parts[2]), int(parts[3]))


def segment_name(owner_pid: int, n: int, key: str | None = None) -> str:
    """Name of the ``n``-th segment made by process ``owner_pid`` for this server."""
    return f"{PREFIX}-{key or server_key()}-{owner_pid}-{n}"


def remove_stale_segments(key: str | None = None) -> list[str]:
    """Remove this pid namespace's segments whose server or owner process is gone; their names."""
    key = key or server_key()
    namespace = int(key.split("-")[1])
    try:
        entries = list(SHM_DIR.iterdir())
    except OSError:
        return []
    stale = []
    for path in entries:
        parsed = SegmentName.parse(path.name)
        if parsed is None or parsed.namespace != namespace:
            continue
        if not (process_alive(parsed.server_pid) and process_alive(parsed.owner_pid)):
            stale.append(path)
    return _unlink(stale)


def remove_segments_of(owner_pid: int, key: str | None = None) -> list[str]:
    """Remove every segment of this server made by process ``owner_pid`` (a front gone)."""
    prefix = f"{PREFIX}-{key or server_key()}-{owner_pid}-"
    return _unlink(SHM_DIR.glob(prefix + "*"))


def _unlink(paths: Iterable[Path]) -> list[str]:
    """Remove ``paths``, skipping any already gone; the names removed."""
    removed = []
    for path in paths:
        try:
            path.unlink()
            removed.append(path.name)
        except OSError:
            pass
    return removed


@dataclass
class Link:
    """One connection of a front to the runtime, and how far its loss has been handled."""

    sock: socket.socket
    closed: threading.Event = field(default_factory=threading.Event)  # its loss is handled
    failed: threading.Event = field(default_factory=threading.Event)  # ... and answered all


def wait_hangup(link: Link) -> None:
    """Return once the peer hung up on ``link`` or it was marked closed (without reading)."""
    poller = select.poll()
    poller.register(link.sock, select.POLLRDHUP)  # POLLHUP and POLLERR are always reported
    while not link.closed.is_set():
        if poller.poll(250):
            return


def runtime_stub_running(runtime_model: str) -> bool:
    """Whether a stub of ``runtime_model`` (a sibling process whose first argument is
    ``<repository>/<runtime_model>/<version>/model.py``) runs beside this process."""
    parent = os.getppid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if int(stat[stat.rindex(")") + 2 :].split()[1]) != parent:
                continue
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if len(argv) > 1 and Path(os.fsdecode(argv[1])).parent.parent.name == runtime_model:
            return True
    return False


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != b"Z"
