"""Free TCP ports (Linux: below ``/proc/sys/net/ipv4/ip_local_port_range``) and the check that a
server's ports are free.
"""

from __future__ import annotations

import contextlib
import random
import socket
from collections.abc import Mapping
from pathlib import Path

from hloserve.errors import PortInUseError


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free when asked (pick it just before binding)."""
    return free_ports(1, host)[0]


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(count: int, host: str = "127.0.0.1", *, contiguous: bool = False) -> tuple[int, ...]:
    """``count`` distinct TCP ports on ``host`` (consecutive if ``contiguous``) free when asked.

    Ports come from 10000 up to the kernel's ephemeral range, never inside it: a client polling
    an ephemeral port before its server binds it can connect to itself (TCP simultaneous open)
    and hold the port.

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
    """Raise PortInUseError (UNAVAILABLE) "<what><endpoint> port <host>:<port> is already in
    use ...<hint>" if a port of ``ports`` (endpoint name -> port) cannot be bound on ``host``
    (TIME_WAIT is not "in use")."""
    for endpoint, port in ports.items():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as e:
                raise PortInUseError(
                    f"{what}{endpoint} port {host}:{port} is already in use ({e}){hint}"
                ) from e
