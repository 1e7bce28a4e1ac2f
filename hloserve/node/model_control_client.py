"""Triton's repository API (load, reload, unload, index) as ``serve --watch`` calls it.

:class:`TritonModelControl` is one server's HTTP endpoint with the restricted-API key
(:mod:`hloserve.model_control`); :class:`FleetModelControl` makes each call on every
running worker of ``serve --workers N``. Used by :mod:`hloserve.node.watcher`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from hloserve.model_control import http_headers


class TritonModelControl:
    """:class:`ModelControl` over a tritonserver's HTTP endpoint, with the model-control key.

    Args:
        http_url: ``host:port``.
        key: the restricted repository API's key (:mod:`hloserve.model_control`).
        timeout_s: seconds a load may take (compiling included).
    """

    def __init__(self, http_url: str, key: str | None, timeout_s: float) -> None:

        self.http_url = http_url
        self.headers = http_headers(key) or {}
        self.timeout_s = timeout_s

    def _client(self) -> Any:
        import tritonclient.http as httpclient

        return httpclient.InferenceServerClient(
            self.http_url, connection_timeout=self.timeout_s, network_timeout=self.timeout_s
        )

    def load(self, model: str) -> None:
        client = self._client()
        try:
            client.load_model(model, headers=self.headers)
        finally:
            client.close()

    def reload(self, model: str) -> None:
        from hloserve.node.watchdog import reload_model

        reload_model(self.http_url, model, self.timeout_s, self.headers)

    def unload(self, model: str) -> None:
        client = self._client()
        try:
            client.unload_model(model, headers=self.headers)
            deadline = time.monotonic() + self.timeout_s
            while time.monotonic() < deadline:  # Triton unloads once in-flight requests end
                index = client.get_model_repository_index(headers=self.headers)
                states = {m["name"]: m.get("state", "") for m in index}
                if states.get(model) not in ("READY", "UNLOADING"):
                    return
                time.sleep(0.1)
        finally:
            client.close()

    def index(self) -> list[dict[str, Any]]:
        """Triton's repository index: ``[{"name", "version", "state", "reason"}, ...]``."""
        client = self._client()
        try:
            return list(client.get_model_repository_index(headers=self.headers))
        finally:
            client.close()


class FleetModelControl:
    """:class:`ModelControl` over several tritonservers serving one repository (``serve
    --workers N --watch``): each change is made on every running worker in turn, so each
    worker's old version serves until its new one is ready.

    A load that fails on a worker raises at once, naming the worker (the workers after it
    keep their old version; the one before it, if any, already serves the new: the next
    change or a restart brings them in line). Workers that have exited are skipped.

    Args:
        controls: one :class:`TritonModelControl` per worker, in worker order.
        running: whether worker ``i`` is running now.
    """

    def __init__(
        self, controls: Sequence[TritonModelControl], running: Callable[[int], bool]
    ) -> None:
        self.controls = list(controls)
        self._running = running

    def _each(self, what: str, action: Callable[[TritonModelControl], None]) -> None:
        for i, control in enumerate(self.controls):
            if not self._running(i):
                continue
            try:
                action(control)
            except Exception as exc:
                raise RuntimeError(f"worker {i} ({control.http_url}): {error_text(exc)}") from exc

    def load(self, model: str) -> None:
        self._each("load", lambda c: c.load(model))

    def reload(self, model: str) -> None:
        self._each("reload", lambda c: c.reload(model))

    def unload(self, model: str) -> None:
        self._each("unload", lambda c: c.unload(model))

    def index(self) -> list[dict[str, Any]]:
        """The first running worker's repository index (every worker serves the same)."""
        for i, control in enumerate(self.controls):
            if self._running(i):
                return control.index()
        return []


def load_all(http_url: str, key: str | None, models: Sequence[str], timeout_s: float) -> None:
    """Load ``models`` (``*``: every model of the repository index but the runtime) through
    the repository API, 4 at a time as Triton loads at start (``--model-load-thread-count``).

    A model that fails to load stays UNAVAILABLE with its reason in the index (reported by
    the supervisor's ready report); the others are loaded all the same.
    """
    from concurrent.futures import ThreadPoolExecutor

    from hloserve.names import RUNTIME_MODEL

    control = TritonModelControl(http_url, key, timeout_s)
    if "*" in models:
        models = [m["name"] for m in control.index() if m["name"] != RUNTIME_MODEL]

    def load(model: str) -> None:
        with contextlib.suppress(Exception):  # Triton keeps the reason in its index
            control.load(model)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(load, models))


def error_text(exc: Exception) -> str:
    """An error's message without the Python backend's traceback (``"\n\nAt:\n  ..."``)."""
    message = getattr(exc, "message", None)
    text = str(message() if callable(message) else (message or exc))
    return text.split("\n\nAt:\n", 1)[0].strip()
