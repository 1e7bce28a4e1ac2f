"""The local channel between front instances and the runtime: messages and shared memory.

docs/serving.md, "Front -> runtime (the channel)". The runtime's stub listens on a Unix
``SOCK_SEQPACKET`` socket in Linux's abstract namespace (no file to leave behind; message
boundaries kept by the kernel); each front instance connects once. Control messages are small
JSON objects, one per datagram. Tensors travel through shared memory: each front instance owns
an arena file in ``/dev/shm`` (created mode 0600, sparse: only touched pages use memory) and
writes a request's inputs there and reserves room for its outputs, which the runtime writes in
place; a request too large for the arena's free space gets its own segment file, removed when
its answer arrives.

Measured before choosing (benchmarks/channel_roundtrip.py, 2 shared CPU cores): a small JSON
round trip over this socket between two processes takes ~23-25 us (p50), over pyzmq 27.3
``ipc://`` (DEALER/ROUTER, abstract address) ~61-63 us; zmq sockets also may not be shared
between threads, so the runtime's executor thread would need one more thread hop to answer.

Addresses and names (:func:`server_key`): derived from what every stub of one tritonserver sees
alike, its parent process (tritonserver) id and the pid namespace's inode, so several servers on
one machine, in containers sharing the host network and ``/dev/shm`` too, never meet. Shared
memory files are named ``hloserve-<server key>-<front pid>-<n>``: leftovers of a server killed
with SIGKILL are matched to their owner and removed by the next runtime of this namespace
(:func:`remove_stale_segments`). The runtime accepts connections only from its own user
(``SO_PEERCRED``).
"""

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

#: Where shared-memory files live (tmpfs).
SHM_DIR = Path("/dev/shm")
#: Prefix of every shared-memory file and socket address of hloserve's channel.
PREFIX = "hloserve.channel"
#: Largest control message, bytes (one datagram); a message lists a few hundred requests at most.
MAX_MESSAGE_BYTES = 1 << 20
#: Default size of a front instance's arena, bytes (sparse: pages cost memory once written).
DEFAULT_ARENA_BYTES = 64 << 20
#: Alignment of every allocation in an arena, bytes (a cache line).
ALIGN = 64


def server_key() -> str:
    """``<tritonserver pid>-<pid namespace inode>``: the same in every stub of one server.

    A Python backend stub is a child of tritonserver, so its parent pid names the server; the
    pid namespace's inode keeps servers in different containers apart.
    """
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
    """Receive one message.

    Raises:
        ChannelClosed: the peer closed the connection (or it broke).
    """
    try:
        data = sock.recv(MAX_MESSAGE_BYTES)
    except OSError as exc:
        raise ChannelClosed(str(exc)) from None
    if not data:
        raise ChannelClosed("the peer closed the channel")
    message: dict[str, Any] = json.loads(data)
    return message


def receive_ready(sock: socket.socket) -> list[dict[str, Any]]:
    """Every message waiting on ``sock`` now (at least one: call when it is readable).

    Raises:
        ChannelClosed: the peer closed the connection and nothing is left to read.
    """
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
    """A listening ``SOCK_SEQPACKET`` socket at ``addr``.

    Raises:
        OSError: the address is in use (another runtime of this server is listening).
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.bind(addr)
    sock.listen(256)
    return sock


def connect(addr: str, timeout: float | None = None) -> socket.socket:
    """A connection to the runtime listening at ``addr``.

    Raises:
        OSError: nobody listens there (ConnectionRefusedError / FileNotFoundError).
    """
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


# -- shared memory -----------------------------------------------------------------------------


class Segment:
    """A shared-memory file in :data:`SHM_DIR`, mapped read-write.

    Args:
        name: the file name (no directory).
        size: bytes; with ``create`` the file is made (mode 0600, must not exist).
        create: create it (the owner) rather than open an existing one.
    """

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
    """A front instance's arena: one :class:`Segment` and a first-fit allocator over it.

    Thread-safe. Offsets are multiples of :data:`ALIGN`.
    """

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
    """Remove the segments of this pid namespace whose server or owner process is gone.

    A segment belongs to the server whose pid its name carries; it is stale when that server
    is not running, or when the front process that made it is not running. Segments of other
    namespaces (other containers) are never touched.

    Returns:
        The names removed.
    """
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
    """Return once the peer hung up on ``link`` or the link was marked closed, without
    reading from it (another thread reads the messages)."""
    poller = select.poll()
    poller.register(link.sock, select.POLLRDHUP)  # POLLHUP and POLLERR are always reported
    while not link.closed.is_set():
        if poller.poll(250):
            return


def runtime_stub_running(runtime_model: str) -> bool:
    """Whether a stub of ``runtime_model`` runs beside this process: a child of the same
    parent (tritonserver) whose command line names ``<repository>/<runtime_model>/<version>/
    model.py`` (the Python backend stub's first argument)."""
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


__all__ = [
    "ALIGN",
    "DEFAULT_ARENA_BYTES",
    "Arena",
    "ChannelClosed",
    "Link",
    "Segment",
    "SegmentName",
    "address",
    "aligned",
    "connect",
    "listen",
    "peer_uid",
    "process_alive",
    "receive",
    "receive_ready",
    "remove_segments_of",
    "remove_stale_segments",
    "runtime_stub_running",
    "segment_name",
    "send",
    "server_key",
    "wait_hangup",
]
