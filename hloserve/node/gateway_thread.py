"""The gateway in a thread of the node's process (``serve --workers N``, ``node up``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading

from hloserve.errors import NodeError
from hloserve.gateway.config import GatewayConfig
from hloserve.ports import free_ports

log = logging.getLogger("hloserve.serve")


class GatewayThread:
    """:func:`~hloserve.gateway.app.run_gateway` on its own event loop in a daemon thread
    (``config.listen`` port 0: a free port); raises NodeError: the gateway did not start within
    60 s (its error chained)."""

    def __init__(self, config: GatewayConfig) -> None:
        if config.http_listen is not None and config.http_listen.endswith(":0"):
            host = config.http_listen.rpartition(":")[0]
            port = free_ports(1, host.strip("[]"))[0]
            config = config.model_copy(update={"http_listen": f"{host}:{port}"})
        self.config = config
        self.port = 0
        self.admin_port = 0
        self.error: BaseException | None = None
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hloserve-gateway", daemon=True)
        self._thread.start()
        if not self._ready.wait(60.0) or self.error is not None:
            self.close()
            raise NodeError(
                f"gateway did not start on {config.listen}: {self.error or 'timed out'}"
            ) from self.error

    @property
    def address(self) -> str:
        """host:port of the gateway's gRPC endpoint."""
        return f"{self.config.listen.rpartition(':')[0]}:{self.port}"

    @property
    def http_address(self) -> str | None:
        """host:port of the gateway's KServe HTTP endpoint (None: gRPC only)."""
        return self.config.http_listen

    def is_running(self) -> bool:
        """Whether the gateway's thread is still serving."""
        return self._thread.is_alive()

    def _on_ready(self, port: int, admin_port: int) -> None:
        self.port, self.admin_port = port, admin_port
        self._ready.set()

    def _run(self) -> None:
        from hloserve.gateway.app import run_gateway

        try:
            self._loop.run_until_complete(
                run_gateway(self.config, self._stop, on_ready=self._on_ready)
            )
        except BaseException as exc:  # reported by the constructor or the supervisor
            self.error = exc
            log.exception("gateway stopped with an error")
        finally:
            self._ready.set()
            self._loop.close()

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the gateway and wait for its thread, ``timeout_s`` beyond its drain time
        (idempotent)."""
        if self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # loop already closed
                self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout_s + self.config.exit_timeout_seconds)
