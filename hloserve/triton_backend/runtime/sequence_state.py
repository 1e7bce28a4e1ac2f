"""Each live sequence's state rows on the runtime's device, per (bundle key, correlation ID):
reset at START, dropped at END or when idle (docs/bundles.md, "Stateful bundles"); executions
:func:`gather` and :func:`scatter` them on the device."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hloserve.bundle.manifest import Manifest
from hloserve.errors import InvalidArgumentError
from hloserve.triton_backend.runtime.device_memory import DeviceMemory


@dataclass
class _Live:
    rows: list[Any]
    used: float
    nbytes: int
    idle_s: float


class SequenceStates:
    """The state rows of every live sequence of the stateful bundles held; ``place`` puts a host
    array on the device, ``memory`` reserves a new sequence's bytes (None: nothing refused)."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        *,
        place: Callable[[np.ndarray], Any] | None = None,
        memory: DeviceMemory | None = None,
    ) -> None:
        self._clock = clock
        self._place = place or _device_put
        self._memory = memory
        self._live: dict[tuple[str, int | str], _Live] = {}  # (bundle key, correlation ID)
        self._lock = threading.Lock()

    def rows(
        self,
        key: str,
        manifest: Manifest,
        sequence: Sequence[Any],
        initial: Callable[[str], np.ndarray],
    ) -> list[Any]:
        """A sequence's state rows (device ``[1, ...]``, one per ``state`` pair) for its next
        request, fresh at START (``initial``: a weight by name). InvalidArgumentError: no START
        for a sequence not held; UnavailableError: a new sequence's state does not fit the device
        budget."""
        corrid, start = sequence[0], bool(sequence[1])
        name = key.partition("#")[0]
        idle_s = manifest.sequencing.max_sequence_idle_microseconds / 1e6
        with self._lock:
            live = self._live.get((key, corrid))
            if not start:
                if live is None:
                    raise InvalidArgumentError(
                        f"model {name!r}: sequence {corrid!r} has no state here (it was not "
                        "started with START, it ended, it was idle longer than "
                        f"{idle_s:g} s, or the runtime restarted); start it again"
                    )
                live.used = self._clock()
                return live.rows
        specs = {s.name: s for s in manifest.inputs}
        fresh = []
        for pair in manifest.state:
            spec = specs[pair.input]
            row = np.zeros(spec.shape_at(1), spec.dtype_info.numpy)
            if pair.initial_weight is not None:
                row[0] = initial(pair.initial_weight)
            fresh.append(row)
        nbytes = sum(int(r.nbytes) for r in fresh)
        with self._lock:
            old = self._live.pop((key, corrid), None)  # START again: the old rows go
        if old is not None:
            self._release(old.nbytes)
        if self._memory is not None:
            self._memory.reserve_state(name, nbytes)  # raises UnavailableError: not kept
        rows = [self._place(r) for r in fresh]
        with self._lock:
            self._live[(key, corrid)] = _Live(rows, self._clock(), nbytes, idle_s)
        return rows

    def store(self, key: str, sequence: Sequence[Any], rows: Sequence[Any]) -> None:
        """Keep a request's new state rows (device arrays), or drop the sequence at END."""
        corrid, end = sequence[0], bool(sequence[2])
        with self._lock:
            if end:
                live = self._live.pop((key, corrid), None)
            else:
                live = self._live.get((key, corrid))
                if live is not None:  # else it expired while it ran
                    live.rows = list(rows)
                    live.used = self._clock()
                return
        if live is not None:
            self._release(live.nbytes)

    def expire(self) -> int:
        """Drop the sequences idle past their model's timeout; how many."""
        now = self._clock()
        with self._lock:
            idle = [k for k, live in self._live.items() if live.used < now - live.idle_s]
            dropped = [self._live.pop(k) for k in idle]
        self._release(sum(live.nbytes for live in dropped))
        return len(idle)

    def drop_bundle(self, key: str) -> None:
        """Forget every sequence of a bundle that is no longer held."""
        with self._lock:
            dropped = [self._live.pop(k) for k in [k for k in self._live if k[0] == key]]
        self._release(sum(live.nbytes for live in dropped))

    def nbytes(self) -> dict[str, int]:
        """Bytes of state held per model name (every generation together)."""
        out: dict[str, int] = {}
        with self._lock:
            for (key, _), live in self._live.items():
                name = key.partition("#")[0]
                out[name] = out.get(name, 0) + live.nbytes
        return out

    def _release(self, nbytes: int) -> None:
        if nbytes and self._memory is not None:
            self._memory.release_state(nbytes)


def gather(rows: Sequence[Any], size: int) -> Any:
    """``rows`` (``[1, ...]`` each) stacked on the device, zero rows after them up to ``size``."""
    if len(rows) == size == 1:
        return rows[0]
    return _gather(size)(*rows)


def scatter(array: Any, count: int) -> list[Any]:
    """The first ``count`` rows of a state output as ``[1, ...]`` device arrays."""
    if count == array.shape[0] == 1:
        return [array]
    return list(_scatter(count)(array))


@functools.cache
def _gather(size: int) -> Callable[..., Any]:
    import jax
    import jax.numpy as jnp

    def stack(*rows: Any) -> Any:
        x = jnp.concatenate(rows, axis=0)
        pad = size - x.shape[0]
        return jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)) if pad else x

    return jax.jit(stack)


@functools.cache
def _scatter(count: int) -> Callable[[Any], Any]:
    import jax

    return jax.jit(lambda x: tuple(x[i : i + 1] for i in range(count)))


def _device_put(array: np.ndarray) -> Any:
    import jax

    return jax.device_put(array)
