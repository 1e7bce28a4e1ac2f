"""Triton's repository API (load, reload, unload, index) on several workers.

One server's client is :class:`hloserve.model_control.RepositoryClient`;
:class:`FleetModelControl` makes each call on every running worker of ``serve --workers N``
(used by :mod:`hloserve.node.watcher`), :func:`load_all` loads a worker's models.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from hloserve.model_control import RepositoryClient


class FleetModelControl:
    """:class:`ModelControl` over several tritonservers serving one repository (``serve
    --workers N --watch``): each change is made on every running worker in turn, so each
    worker's old version serves until its new one is ready.

    A load that fails on a worker raises at once, naming the worker (the workers after it
    keep their old version; the one before it, if any, already serves the new: the next
    change or a restart brings them in line). Workers that have exited are skipped.

    Args:
        controls: one :class:`~hloserve.model_control.RepositoryClient` per worker, in worker order.
        running: whether worker ``i`` is running now.
    """

    def __init__(
        self, controls: Sequence[RepositoryClient], running: Callable[[int], bool]
    ) -> None:
        self.controls = list(controls)
        self._running = running

    def _each(self, what: str, action: Callable[[RepositoryClient], None]) -> None:
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

    control = RepositoryClient(http_url, key, timeout_s)
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
