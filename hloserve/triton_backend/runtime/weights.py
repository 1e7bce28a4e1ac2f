"""Where the runtime keeps each bundle's weights (``main``'s leading arguments): the
:class:`WeightStore` interface, acquired around each execution, and the all-resident store.
The weight cache (:mod:`~hloserve.triton_backend.runtime.weight_cache`) is the other store."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from hloserve.bundle.bundle import Bundle
from hloserve.errors import HloserveError, Status


class WeightStore(Protocol):
    """A runtime's weights, by bundle key (thread-safe)."""

    def add(self, name: str, bundle: Bundle, device: Any) -> None:
        """Register ``bundle``'s weights under ``name`` for ``device``; HloserveError INTERNAL
        if registered, or the bundle's error."""

    def acquire(self, name: str) -> Sequence[Any]:
        """The weights as device arrays in ``weights.order``, kept in place until release;
        NOT_FOUND if ``name`` is not registered."""

    def release(self, name: str) -> None:
        """End one :meth:`acquire` of ``name``."""

    def remove(self, name: str) -> None:
        """Forget ``name`` and free its device memory (no-op if unknown)."""

    @property
    def resident_bytes(self) -> int:
        """Bytes of weights currently on the device."""

    def pinned(self, name: str) -> bool:
        """Whether ``name``'s weights stay on the device from :meth:`add` on (never evicted)."""


@contextlib.contextmanager
def acquired(store: WeightStore, name: str) -> Iterator[Sequence[Any]]:
    """``with acquired(store, name) as weights:`` -- acquire, then always release."""
    weights = store.acquire(name)
    try:
        yield weights
    finally:
        store.release(name)


class ResidentWeightStore:
    """Every registered bundle's weights stay on the device until :meth:`remove`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._weights: dict[str, list[Any]] = {}
        self._nbytes: dict[str, int] = {}
        self._in_use: dict[str, int] = {}

    def add(self, name: str, bundle: Bundle, device: Any) -> None:
        import jax

        with self._lock:
            if name in self._weights:
                raise HloserveError(
                    f"weights of model {name!r} are already registered", status=Status.INTERNAL
                )
        host = bundle.load_weights()
        placed = [jax.device_put(w, device) for w in host]
        for array in placed:
            array.block_until_ready()
        with self._lock:
            self._weights[name] = placed
            self._nbytes[name] = sum(int(w.nbytes) for w in host)
            self._in_use[name] = 0

    def acquire(self, name: str) -> Sequence[Any]:
        with self._lock:
            if name not in self._weights:
                raise HloserveError(
                    f"weights of model {name!r} are not registered", status=Status.NOT_FOUND
                )
            self._in_use[name] += 1
            return self._weights[name]

    def release(self, name: str) -> None:
        with self._lock:
            if self._in_use.get(name, 0) > 0:
                self._in_use[name] -= 1

    def remove(self, name: str) -> None:
        with self._lock:
            for table in (self._weights, self._nbytes, self._in_use):
                table.pop(name, None)

    @property
    def resident_bytes(self) -> int:
        with self._lock:
            return sum(self._nbytes.values())

    def pinned(self, name: str) -> bool:
        return True

    def in_use(self, name: str) -> int:
        """How many acquisitions of ``name`` are not released yet."""
        with self._lock:
            return self._in_use.get(name, 0)
