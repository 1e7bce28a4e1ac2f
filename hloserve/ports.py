"""Free TCP ports and the check that the ports a server will bind are free.

Linux: the kernel's ephemeral range is read from ``/proc/sys/net/ipv4/ip_local_port_range``.
"""

from __future__ import annotations

import contextlib
import random
import socket
from collections.abc import Mapping
from pathlib import Path

from hloserve.errors import PortInUseError


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that was free when asked.

    Another process may take the port before it is used; tests that start servers should pick
    ports immediately before starting them.
    """
    return free_ports(1, host)[0]


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (``ip_local_port_range``; 32768 if unread)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(count: int, host: str = "127.0.0.1", *, contiguous: bool = False) -> tuple[int, ...]:
    """Return ``count`` distinct TCP ports on ``host`` that were free when asked.

    Ports come from 10000 up to the kernel's ephemeral range, never from inside it: a client
    polling a port in the ephemeral range before its server binds it can connect to itself (TCP
    simultaneous open, its own source port being the target) and then hold the port, so the
    server fails with "address already in use". All sockets are held open until every port is
    chosen, so the ports differ.

    Args:
        count: how many ports.
        host: the address they must be free on.
        contiguous: the ports must be consecutive (``base .. base + count - 1``).

    Raises:
        ValueError: ``count`` is below 1.
        OSError: no such ports were found in 200 tries.
    """
    if count < 1:
        raise ValueError(f"free_ports: count must be >= 1, got {count}")
    rng = random.Random()
    high = max(_ephemeral_low(), 10000 + 2 * count)
    for _ in range(200):
        if contiguous:
            base = rng.randrange(10000, high - count)
            candidates = list(range(base, base + count))
        else:
            candidates = rng.sample(range(10000, high), count)
        with contextlib.ExitStack() as stack:
            try:
                for port in candidates:
                    sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                    sock.bind((host, port))
            except OSError:
                continue
            return tuple(candidates)
    raise OSError(f"free_ports: no {count} free ports on {host} below {high} after 200 tries")


def check_ports_free(host: str, ports: Mapping[str, int], what: str = "", hint: str = "") -> None:
    """Raise PortInUseError if a port cannot be bound on ``host`` (TIME_WAIT is not "in use").

    Args:
        host: the address the ports will be bound on.
        ports: port by endpoint name ("gRPC", "metrics", ...).
        what: prefix of the message's endpoint name, e.g. "gateway ".
        hint: appended to the message, e.g. what to change.

    Raises:
        PortInUseError: (UNAVAILABLE) "<what><endpoint> port <host>:<port> is already in use".
    """
    for endpoint, port in ports.items():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as e:
                raise PortInUseError(
                    f"{what}{endpoint} port {host}:{port} is already in use ({e}){hint}"
                ) from e
