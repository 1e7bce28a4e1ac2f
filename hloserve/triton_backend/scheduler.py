"""The runtime's scheduler: per-model queues, one execution at a time, coalescing.

STAND-IN with the final module's API (FIFO only): every discipline is served as ``fifo``
(globally oldest request first). The coalescing rule is the final one (docs/serving.md,
"Coalescing rule"): the chosen model's leading run of same-variant works, in arrival order,
up to the largest compiled size the queued rows fill, else the smallest that holds them
(padded); a work is never split. Works whose deadline has passed are shed before selection.

Pure Python, thread-safe: any thread may :meth:`Scheduler.submit`; one thread loops
:meth:`Scheduler.next` -> execute -> :meth:`Scheduler.record`.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

Discipline = Literal["fair", "fifo", "edf"]


@dataclass(frozen=True)
class SchedulerConfig:
    """How the scheduler picks the next model (the stand-in serves every discipline as fifo).

    Attributes:
        discipline: ``fair``, ``fifo`` or ``edf``.
        weights: model -> weight (> 0); missing models weigh 1.0.
        ema_half_life_s: fair: recent-compute EMA half-life, seconds.
        priority_cap: fair: clamp of share - normalized EMA.
        coalescing_discount: fair: effective cost = cost * (1 - discount).
        unseeded_cost_s: cost estimate before any measurement, seconds.
        cost_ema_alpha: per (model, variant, batch size) cost EMA weight of a new measurement.
    """

    discipline: Discipline = "fair"
    weights: Mapping[str, float] = field(default_factory=dict)
    ema_half_life_s: float = 30.0
    priority_cap: float = 0.25
    coalescing_discount: float = 0.10
    unseeded_cost_s: float = 0.01
    cost_ema_alpha: float = 0.2


@dataclass
class Work:
    """One client request (never split).

    Attributes:
        model: the registered model.
        variant: index of the bundle's shape variant (0 without variants).
        rows: items on the batch axis (>= 1; 1 for an unbatched model).
        payload: opaque to the scheduler (the runtime's reply handle).
        deadline: monotonic seconds (the scheduler's clock), None = none.
        arrival: set by :meth:`Scheduler.submit` from the clock when not given.
    """

    model: str
    variant: int
    rows: int
    payload: object
    deadline: float | None = None
    arrival: float = -1.0


@dataclass(frozen=True)
class Batch:
    """One execution: whole works of one model and variant, in arrival order.

    Attributes:
        batch_size: the compiled size it runs at (>= items; the rest is padding).
        items: sum of the works' rows.
    """

    model: str
    variant: int
    batch_size: int
    works: tuple[Work, ...]
    items: int


@dataclass(frozen=True)
class SchedulerSnapshot:
    """Queue depth per model and cost estimates per (model, variant, batch size), seconds."""

    queued: Mapping[str, int]
    costs: Mapping[tuple[str, int, int], float]


@dataclass
class _Model:
    sizes: list[int]
    coalesce: bool
    variants: set[int]
    queue: deque[Work] = field(default_factory=deque)


class Scheduler:
    """Per-model queues feeding one executor (see the module docstring).

    Args:
        config: the discipline and its constants.
        on_shed: called outside the lock with each shed work and the reason.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        config: SchedulerConfig,
        on_shed: Callable[[Work, str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._on_shed = on_shed
        self._clock = clock
        self._models: dict[str, _Model] = {}
        self._costs: dict[tuple[str, int, int], float] = {}
        self._cond = threading.Condition()
        self._closed = False

    def register(
        self, model: str, variant: int, compiled_sizes: Sequence[int], coalesce: bool = True
    ) -> None:
        """Accept works of ``model`` at ``variant`` run at ``compiled_sizes`` (ascending)."""
        with self._cond:
            entry = self._models.get(model)
            if entry is None:
                entry = self._models[model] = _Model(sorted(compiled_sizes), coalesce, set())
            entry.sizes = sorted(compiled_sizes)
            entry.coalesce = coalesce
            entry.variants.add(variant)

    def unregister(self, model: str) -> list[Work]:
        """Forget ``model``; returns its works still queued."""
        with self._cond:
            entry = self._models.pop(model, None)
            return list(entry.queue) if entry is not None else []

    def submit(self, work: Work) -> None:
        """Queue one work.

        Raises:
            ValueError: unknown model or variant, rows above the largest compiled size, or the
                scheduler is closed.
        """
        with self._cond:
            if self._closed:
                raise ValueError("the scheduler is closed")
            entry = self._models.get(work.model)
            if entry is None or work.variant not in entry.variants:
                raise ValueError(f"model {work.model!r} variant {work.variant} is not registered")
            if entry.sizes and work.rows > entry.sizes[-1]:
                raise ValueError(
                    f"model {work.model!r}: {work.rows} rows exceed the largest compiled "
                    f"batch size {entry.sizes[-1]}"
                )
            if work.arrival < 0:
                work.arrival = self._clock()
            entry.queue.append(work)
            self._cond.notify()

    def next(self, timeout: float | None = None) -> Batch | None:
        """The next execution; blocks up to ``timeout`` seconds; None on timeout or close."""
        end = None if timeout is None else self._clock() + timeout
        while True:
            shed: list[Work] = []
            with self._cond:
                batch = None
                while not self._closed:
                    shed = self._shed_expired()
                    if shed:
                        break
                    batch = self._select()
                    if batch is not None:
                        break
                    remaining = None if end is None else end - self._clock()
                    if remaining is not None and remaining <= 0:
                        break
                    self._cond.wait(remaining)
            for work in shed:
                self._on_shed(work, "the request's deadline passed before it could run")
            if not shed:
                return batch

    def _shed_expired(self) -> list[Work]:
        now = self._clock()
        shed = []
        for entry in self._models.values():
            if any(w.deadline is not None and w.deadline <= now for w in entry.queue):
                keep = deque(w for w in entry.queue if w.deadline is None or w.deadline > now)
                shed += [w for w in entry.queue if w.deadline is not None and w.deadline <= now]
                entry.queue = keep
        return shed

    def _select(self) -> Batch | None:
        oldest: tuple[float, str] | None = None
        for name, entry in self._models.items():
            if entry.queue and (oldest is None or entry.queue[0].arrival < oldest[0]):
                oldest = (entry.queue[0].arrival, name)
        if oldest is None:
            return None
        name = oldest[1]
        entry = self._models[name]
        first = entry.queue[0]
        if not entry.sizes:  # unbatched: one work per execution
            entry.queue.popleft()
            return Batch(name, first.variant, 0, (first,), first.rows)
        largest = entry.sizes[-1]
        works = [entry.queue.popleft()]
        items = first.rows
        while entry.coalesce and entry.queue:
            nxt = entry.queue[0]
            if nxt.variant != first.variant or items + nxt.rows > largest:
                break
            works.append(entry.queue.popleft())
            items += nxt.rows
        # the largest compiled size the rows fill, else the smallest holding them: with whole
        # works taken greedily up to the largest size, that is the smallest holding them
        size = entry.sizes[bisect.bisect_left(entry.sizes, items)]
        return Batch(name, first.variant, size, tuple(works), items)

    def record(self, batch: Batch, seconds: float) -> None:
        """Learn the measured execution time of ``batch`` (per-size EMA)."""
        key = (batch.model, batch.variant, batch.batch_size)
        alpha = self.config.cost_ema_alpha
        with self._cond:
            old = self._costs.get(key)
            self._costs[key] = seconds if old is None else (1 - alpha) * old + alpha * seconds

    def cost(self, model: str, variant: int, batch_size: int) -> float:
        """The cost estimate of one execution, seconds (unseeded until measured)."""
        with self._cond:
            return self._costs.get((model, variant, batch_size), self.config.unseeded_cost_s)

    def snapshot(self) -> SchedulerSnapshot:
        """Queue depth per model and the cost estimates."""
        with self._cond:
            return SchedulerSnapshot(
                {n: len(e.queue) for n, e in self._models.items()}, dict(self._costs)
            )

    def close(self) -> None:
        """Wake :meth:`next` (it returns None from now on); later submits raise."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


__all__ = ["Batch", "Discipline", "Scheduler", "SchedulerConfig", "SchedulerSnapshot", "Work"]
