"""Fronts over an in-process runtime: the path the ``hloserve_front`` shim takes, minus Triton.

Imported by test_front.py, test_runtime.py and test_variants_hooks.py: a :class:`RuntimeServer`
listens on a Unix socket of its own; each front is a :class:`ChannelFront` (``inline``, as the
shim's default) over it, and :meth:`Front.execute` sends one Triton ``execute`` call's requests
and returns their results in order. :class:`RecordingRuntime` notes each execution (model,
variant, compiled batch size, input shapes), which is what the scheduler's coalescing decided.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hloserve.bundle.bundle import load_bundle
from hloserve.triton_backend.front.core import FrontModel
from hloserve.triton_backend.front.front_channel import ChannelFront, Request
from hloserve.triton_backend.front.hooks import Hooks, load_hooks
from hloserve.triton_backend.runtime.core import LoadedBundle, RuntimeModel
from hloserve.triton_backend.runtime.scheduler import SchedulerConfig
from hloserve.triton_backend.runtime.server import RuntimeServer

#: One request's outcome: its output tensors by name, or the error it got.
Result = dict[str, np.ndarray] | Exception


@dataclass(frozen=True)
class Execution:
    """One execution the runtime ran: model, variant index, batch size, input shapes."""

    model: str
    variant: int
    batch_size: int
    shapes: tuple[tuple[int, ...], ...]


class RecordingRuntime(RuntimeModel):
    """A :class:`RuntimeModel` that notes each execution in :attr:`calls` (and can fail one:
    ``fail`` maps the executions' inputs to an exception to raise, or None)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls: list[Execution] = []
        self.fail: Any = None

    def run(
        self, loaded: LoadedBundle, variant: int, batch_size: int, inputs: Sequence[np.ndarray]
    ) -> list[Any]:
        self.calls.append(
            Execution(loaded.name, variant, batch_size, tuple(a.shape for a in inputs))
        )
        if self.fail is not None:
            error = self.fail(inputs)
            if error is not None:
                raise error
        return super().run(loaded, variant, batch_size, inputs)


def server_key() -> str:
    """A server key of this namespace no real server has (pid field = this process)."""
    return f"{os.getpid()}-{os.stat('/proc/self/ns/pid').st_ino}"


@contextmanager
def runtime_server(address: str | None = None, **kwargs: Any) -> Iterator[RuntimeServer]:
    """A started :class:`RuntimeServer` over a :class:`RecordingRuntime` (fifo) at ``address``
    (default an address of its own); closed on exit."""
    server = RuntimeServer(
        RecordingRuntime(**kwargs),
        address=address or f"\0hloserve.channel-test-{uuid.uuid4().hex}",
        scheduler_config=SchedulerConfig(discipline="fifo"),
        key=server_key(),
        flush_interval_s=0.05,
    )
    server.start()
    try:
        yield server
    finally:
        server.close()


class Front:
    """One inline front instance of a bundle over ``server``.

    Args:
        server: the runtime it talks to; None to dial ``address`` (a runtime that is not
            there, or comes later, with the key :func:`server_key`).
        name: the model name.
        bundle: the bundle directory.
        hooks: the hooks; default the bundle's own ``model.py`` (identity without one).
        wait_s: how long a request waits for the runtime, seconds.
        address: the runtime's address; default ``server``'s.
    """

    def __init__(
        self,
        server: RuntimeServer | None,
        name: str,
        bundle: Path,
        *,
        hooks: Hooks | None = None,
        wait_s: float = 30.0,
        address: str | None = None,
    ) -> None:
        loaded = load_bundle(bundle)
        self.core = FrontModel(
            name, loaded, hooks=hooks if hooks is not None else load_hooks(name, loaded)
        )
        self._results: dict[int, Result] = {}
        self.channel = ChannelFront(
            self.core,
            bundle,
            self._respond,
            address=address or (server.address if server is not None else ""),
            key=server.key if server is not None else server_key(),
            wait_s=wait_s,
            inline=True,
        )
        self.channel.start(wait_s=60.0)

    def _respond(self, handle: Any, result: Any) -> None:
        self._results[handle] = result

    def execute(self, requests: Sequence[Mapping[str, np.ndarray] | Exception]) -> list[Result]:
        """One Triton ``execute`` call: each request's outputs or error, in order."""
        self._results = {}
        self.channel.run([Request(i, r) for i, r in enumerate(requests)])
        return [self._results[i] for i in range(len(requests))]

    def close(self) -> None:
        """Disconnect (the runtime releases the bundle) and remove the arena."""
        self.channel.close()


@contextmanager
def front(server: RuntimeServer, name: str, bundle: Path, **kwargs: Any) -> Iterator[Front]:
    """A :class:`Front` of ``bundle`` over ``server`` whose recorded executions start empty;
    closed on exit."""
    f = Front(server, name, bundle, **kwargs)
    runtime = server.core
    assert isinstance(runtime, RecordingRuntime)
    runtime.calls.clear()
    try:
        yield f
    finally:
        f.close()


def ok(result: Result) -> dict[str, np.ndarray]:
    """``result``'s tensors (fails the test with the error it got)."""
    assert not isinstance(result, Exception), result
    return result
