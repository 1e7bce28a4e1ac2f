"""Each live sequence's state, kept by the runtime between the requests of the sequence.

docs/bundles.md, "Stateful bundles". Triton's sequence batcher routes a sequence's requests
(a correlation ID, START and END flags) to the front; Triton's implicit state does not reach a
Python-backend model, so the runtime keeps the state: per (bundle key, correlation ID), one row
per ``state`` pair of the manifest, as host arrays. At START a sequence's rows are reset to the
initial value (zeros or a weight), at END they are dropped, and a sequence idle for
:data:`~hloserve.bundle.front_spec.MAX_SEQUENCE_IDLE_US` (the front config's
``max_sequence_idle_microseconds``) is dropped by :meth:`SequenceStates.expire`, as Triton frees
its slot without telling the backend.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from hloserve.bundle.front_spec import MAX_SEQUENCE_IDLE_US
from hloserve.bundle.manifest import Manifest
from hloserve.errors import InvalidArgumentError


@dataclass
class _Live:
    rows: list[np.ndarray]
    used: float


class SequenceStates:
    """The state rows of every live sequence of every stateful bundle this runtime holds.

    Args:
        idle_s: seconds after its last request that a sequence's state is dropped.
        clock: ``time.monotonic`` (tests pass another).
    """

    def __init__(
        self,
        idle_s: float = MAX_SEQUENCE_IDLE_US / 1e6,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.idle_s = idle_s
        self._clock = clock
        self._live: dict[tuple[str, int], _Live] = {}
        self._lock = threading.Lock()

    def load(
        self,
        key: str,
        manifest: Manifest,
        sequence: Sequence[object],
        initial: Callable[[str], np.ndarray],
        into: Sequence[np.ndarray],
    ) -> None:
        """Write a sequence's state into one request's state inputs (``[1, ...]`` views).

        Args:
            key: the bundle key (``name`` or ``name#generation``).
            manifest: its manifest (``state`` gives the pairs, ``inputs`` their specs).
            sequence: the work's ``[correlation ID, START, END]``.
            initial: a weight's host array by name (for ``initial: weight:NAME``).
            into: the request's input views, in the manifest's input order.

        Raises:
            InvalidArgumentError: a request without START for a sequence the runtime does not
                hold (never started, ended, idle past the timeout, or the runtime restarted).
        """
        corrid, start = int(sequence[0]), bool(sequence[1])  # type: ignore[call-overload]
        index = {s.name: i for i, s in enumerate(manifest.inputs)}
        with self._lock:
            live = self._live.get((key, corrid))
            if start or live is None:
                if not start:
                    raise InvalidArgumentError(
                        f"model {key.partition('#')[0]!r}: sequence {corrid} has no state here "
                        "(it was not started with START, it ended, it was idle longer than "
                        f"{self.idle_s:g} s, or the runtime restarted); start it again"
                    )
                rows = []
                for pair in manifest.state:
                    view = into[index[pair.input]]
                    weight = pair.initial_weight
                    row = np.zeros(view.shape[1:], view.dtype)
                    if weight is not None:
                        row[...] = initial(weight)
                    rows.append(row)
                live = self._live[(key, corrid)] = _Live(rows, self._clock())
            for pair, row in zip(manifest.state, live.rows, strict=True):
                into[index[pair.input]][0] = row
            live.used = self._clock()

    def store(
        self,
        key: str,
        manifest: Manifest,
        sequence: Sequence[object],
        outputs: Sequence[np.ndarray],
    ) -> None:
        """Keep a request's new state (its state outputs), or drop the sequence at END."""
        corrid, end = int(sequence[0]), bool(sequence[2])  # type: ignore[call-overload]
        index = {s.name: i for i, s in enumerate(manifest.outputs)}
        with self._lock:
            if end:
                self._live.pop((key, corrid), None)
                return
            live = self._live.get((key, corrid))
            if live is None:  # expired while it ran
                return
            for row, pair in zip(live.rows, manifest.state, strict=True):
                row[...] = outputs[index[pair.output]][0]
            live.used = self._clock()

    def expire(self) -> int:
        """Drop the sequences idle longer than ``idle_s``; how many were dropped."""
        cutoff = self._clock() - self.idle_s
        with self._lock:
            idle = [k for k, live in self._live.items() if live.used < cutoff]
            for k in idle:
                del self._live[k]
        return len(idle)

    def drop_bundle(self, key: str) -> None:
        """Forget every sequence of a bundle that is no longer held."""
        with self._lock:
            for k in [k for k in self._live if k[0] == key]:
                del self._live[k]

    def nbytes(self) -> dict[str, int]:
        """Bytes of state held per model name (every generation together)."""
        out: dict[str, int] = {}
        with self._lock:
            for (key, _), live in self._live.items():
                name = key.partition("#")[0]
                out[name] = out.get(name, 0) + sum(int(r.nbytes) for r in live.rows)
        return out
