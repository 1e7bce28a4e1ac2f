"""Triton's repository API on several workers (:class:`FleetModelControl`) and
:func:`load_all`; one server's client is :class:`hloserve.model_control.RepositoryClient`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hloserve.model_control import RepositoryClient
from hloserve.names import RUNTIME_MODEL


class FleetModelControl:
    """The watcher's model control over several tritonservers serving one repository: each
    call is made on every running worker in turn (``running(i)``); a failure raises at once,
    naming the worker (those after it keep their old version).
    """

    def __init__(
        self, controls: Sequence[RepositoryClient], running: Callable[[int], bool]
    ) -> None:
        self.controls = list(controls)
        self._running = running

    def _each(self, action: Callable[[RepositoryClient], None]) -> None:
        for i, control in enumerate(self.controls):
            if not self._running(i):
                continue
            try:
                action(control)
            except Exception as exc:
                raise RuntimeError(f"worker {i} ({control.http_url}): {error_text(exc)}") from exc

    def load(self, model: str) -> None:
        """Load or reload ``model`` on every running worker."""
        self._each(lambda c: c.load(model))

    def reload(self, model: str) -> None:
        """Load ``model`` again (fresh instances) on every running worker."""
        self._each(lambda c: c.reload(model))

    def unload(self, model: str) -> None:
        """Unload ``model`` on every running worker."""
        self._each(lambda c: c.unload(model))

    def index(self) -> list[dict[str, Any]]:
        """The first running worker's repository index (every worker serves the same)."""
        for i, control in enumerate(self.controls):
            if self._running(i):
                return control.index()
        return []


def load_all(http_url: str, key: str | None, models: Sequence[str], timeout_s: float) -> None:
    """Load ``models`` (``*``: every one in the index but the runtime), 4 at a time as Triton
    does at start; a failed one stays UNAVAILABLE with its reason in the index."""
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
