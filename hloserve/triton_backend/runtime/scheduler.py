"""The runtime's scheduler (docs/scheduling.md): settings, per-model queues, coalescing, cost
learning; the loop calls :meth:`Scheduler.next`, executes, then :meth:`Scheduler.record`.
Thread-safe; no JAX, Triton or NumPy."""

from __future__ import annotations

import bisect
import collections
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, cast

from hloserve import names
from hloserve.errors import SchedulerClosedError
from hloserve.model_parameters import RuntimeParameters

#: Triton's own text for a request whose ``timeout`` passed in its queue (answered UNAVAILABLE)
REASON_EXPIRED = "Request timeout expired"
REASON_CANCELLED = "the request was cancelled by its client before it was executed"

_log = logging.getLogger(__name__)

Discipline = Literal["fair", "fifo", "edf"]
#: The disciplines, the default first (docs/scheduling.md, "Disciplines").
DISCIPLINES = cast(tuple[Discipline, ...], names.SCHEDULING_DISCIPLINES)
#: Weight of a model :attr:`SchedulerConfig.weights` does not list.
DEFAULT_WEIGHT = 1.0


#: (field, its range as errors say it, test) of the numeric settings
_RANGES: tuple[tuple[str, str, Callable[[float], bool]], ...] = (
    ("ema_half_life_s", "> 0", lambda v: v > 0),
    ("priority_cap", "in (0, 1]", lambda v: 0 < v <= 1),
    ("coalescing_discount", "in [0, 1)", lambda v: 0 <= v < 1),
    ("unseeded_cost_s", "> 0", lambda v: v > 0),
    ("cost_ema_alpha", "in (0, 1]", lambda v: 0 < v <= 1),
)


@dataclass(frozen=True)
class SchedulerConfig:
    """Scheduler settings (docs/scheduling.md, "Settings"; defaults are ReactantServer's);
    unlisted models weigh :data:`DEFAULT_WEIGHT`; ValueError (naming the field) for a value out
    of range."""

    discipline: Discipline = "fair"
    weights: Mapping[str, float] = field(default_factory=dict)
    ema_half_life_s: float = 30.0
    priority_cap: float = 0.25
    coalescing_discount: float = 0.10
    unseeded_cost_s: float = 0.01
    cost_ema_alpha: float = 0.2

    def __post_init__(self) -> None:
        if self.discipline not in DISCIPLINES:
            raise ValueError(
                f"scheduling discipline {self.discipline!r} is not one of {list(DISCIPLINES)}"
            )
        for model, weight in self.weights.items():
            if not (math.isfinite(weight) and weight > 0):
                raise ValueError(
                    f"weight of model {model!r} must be a finite number > 0, got {weight!r}"
                )
        for name, allowed, ok in _RANGES:
            if not ok(getattr(self, name)):
                raise ValueError(f"{name} must be {allowed}, got {getattr(self, name)}")
        object.__setattr__(self, "weights", MappingProxyType(dict(self.weights)))

    def weight(self, model: str) -> float:
        """``model``'s weight (:data:`DEFAULT_WEIGHT` when unlisted)."""
        return self.weights.get(model, DEFAULT_WEIGHT)

    @classmethod
    def from_parameters(
        cls, parameters: Mapping[str, str], *, model: str = names.RUNTIME_MODEL
    ) -> SchedulerConfig:
        """The config of the runtime model's parameters ``names.PARAM_SCHEDULING`` and
        ``names.PARAM_MODEL_WEIGHTS``; InvalidArgumentError (naming ``model`` and the parameter)
        for an unknown discipline or a bad weight."""
        discipline = RuntimeParameters.read(model, parameters, names.PARAM_SCHEDULING)
        weights = RuntimeParameters.read(model, parameters, names.PARAM_MODEL_WEIGHTS)
        return cls(discipline=cast(Discipline, discipline), weights=weights)


@dataclass(eq=False)
class Work:
    """One client request, never split: ``rows`` on the batch axis, times in clock seconds;
    ``committed``: a meta's sub-call, ahead of its model's queue and never shed by the laxity
    rule (docs/scheduling.md, "The loop")."""

    model: str
    variant: int
    rows: int
    payload: object
    deadline: float | None = None
    arrival: float = math.nan
    committed: bool = False


@dataclass(frozen=True)
class Batch:
    """One execution: whole works of one model and variant, in arrival order, padded to
    ``batch_size``."""

    model: str
    variant: int
    batch_size: int
    works: tuple[Work, ...]
    items: int


@dataclass(frozen=True)
class ModelSnapshot:
    """One model's queue, weight and share, decayed recent compute (s), measured costs (s)."""

    queued: int
    queued_rows: int
    weight: float
    share: float
    recent_compute_s: float
    costs: Mapping[tuple[int, int], float]


@dataclass(frozen=True)
class SchedulerSnapshot:
    """The scheduler's state (``shed`` counts since start)."""

    discipline: Discipline
    models: Mapping[str, ModelSnapshot]
    shed: int


@dataclass
class _Model:
    sizes: dict[int, tuple[int, ...]]  # variant -> compiled sizes, ascending
    coalesce: dict[int, bool]
    queue: collections.deque[Work] = field(default_factory=collections.deque)
    recent: float = 0.0  # recent-compute EMA, seconds, as of `recent_at`
    recent_at: float = 0.0
    plan: Batch | None = None  # the batch the queue would run now; None = to compute

    def planned(self, name: str) -> Batch:
        """The batch the queue would run now (kept until the queue or the sizes change)."""
        if self.plan is None:
            self.plan = _plan(name, self)
        return self.plan


class Scheduler:
    """Per-model queues and the choice of the next execution (docs/scheduling.md);
    ``on_shed(work, reason)`` runs outside the lock and must not call :meth:`next`."""

    def __init__(
        self,
        config: SchedulerConfig,
        on_shed: Callable[[Work, str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = config
        self._on_shed = on_shed
        self._clock = clock
        self._ready = threading.Condition(threading.Lock())  # guards all state
        self._models: dict[str, _Model] = {}
        self._costs: dict[tuple[str, int, int], float] = {}
        self._closed = False
        self._shed = 0

    def register(
        self, model: str, variant: int, compiled_sizes: Sequence[int], coalesce: bool = True
    ) -> None:
        """Make ``model``'s ``variant`` schedulable at ``compiled_sizes`` (again: replace them;
        ``coalesce`` False: one work per batch); ValueError for no sizes, a size below 1, or a
        queued request above the new largest."""
        sizes = tuple(sorted(set(int(s) for s in compiled_sizes)))
        if not sizes or sizes[0] < 1:
            raise ValueError(
                f"model {model!r} variant {variant}: no compiled batch sizes or one below 1 "
                f"(got {list(compiled_sizes)})"
            )
        with self._ready:
            entry = self._models.get(model)
            if entry is None:
                entry = self._models[model] = _Model({}, {}, recent_at=self._clock())
            big = [w.rows for w in entry.queue if w.variant == variant and w.rows > sizes[-1]]
            if big:
                raise ValueError(
                    f"model {model!r} variant {variant}: queued requests of {max(big)} rows "
                    f"exceed the new largest compiled size {sizes[-1]}"
                )
            entry.sizes[variant] = sizes
            entry.coalesce[variant] = coalesce
            entry.plan = None

    def unregister(self, model: str) -> list[Work]:
        """Forget ``model`` (variants, costs, EMA); its queued works, for the caller to answer."""
        with self._ready:
            entry = self._models.pop(model, None)
            for key in [k for k in self._costs if k[0] == model]:
                del self._costs[key]
            return list(entry.queue) if entry is not None else []

    def submit(self, work: Work) -> None:
        """Queue ``work`` (a committed one behind the committed works only). ValueError: unknown
        model or variant, or rows outside 1..largest compiled size; SchedulerClosedError after
        :meth:`close`."""
        with self._ready:
            if self._closed:
                raise SchedulerClosedError("the runtime's scheduler is closed (stopping)")
            entry = self._models.get(work.model)
            if entry is None:
                raise ValueError(f"model {work.model!r} is not registered with the scheduler")
            sizes = entry.sizes.get(work.variant)
            if sizes is None:
                raise ValueError(
                    f"model {work.model!r} has no variant {work.variant} "
                    f"(registered: {sorted(entry.sizes)})"
                )
            if not 1 <= work.rows <= sizes[-1]:
                raise ValueError(
                    f"model {work.model!r} variant {work.variant}: a request of {work.rows} "
                    f"rows is outside 1..{sizes[-1]} (the largest compiled batch size)"
                )
            if math.isnan(work.arrival):
                work.arrival = self._clock()
            if work.committed:
                ahead = sum(1 for _ in itertools.takewhile(lambda w: w.committed, entry.queue))
                entry.queue.insert(ahead, work)
            else:
                entry.queue.append(work)
            entry.plan = None
            self._ready.notify()

    def cancel(self, match: Callable[[Work], bool]) -> int:
        """Shed the queued works ``match`` accepts (:data:`REASON_CANCELLED`); how many."""
        with self._ready:
            shed: list[tuple[Work, str]] = []
            for entry in self._models.values():
                hit = {id(w) for w in entry.queue if match(w)}
                if hit:
                    shed += [(w, REASON_CANCELLED) for w in entry.queue if id(w) in hit]
                    keep = collections.deque(w for w in entry.queue if id(w) not in hit)
                    entry.queue, entry.plan = keep, None
            self._shed += len(shed)
        self._report(shed)
        return len(shed)

    def next(self, timeout: float | None = None) -> Batch | None:
        """Shed hopeless works, then the next batch (docs/scheduling.md, "The loop"), waiting up
        to ``timeout`` seconds (None = forever); None on timeout or after close."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._ready:
                while not self._closed and not any(m.queue for m in self._models.values()):
                    left = None if end is None else end - time.monotonic()
                    if left is not None and left <= 0:
                        return None
                    self._ready.wait(left)
                if self._closed:
                    return None
                now = self._clock()
                shed = self._shed_hopeless(now)
                batch = self._select(now)
            self._report(shed)
            if batch is not None:
                return batch

    def record(self, batch: Batch, seconds: float) -> None:
        """Learn ``batch``'s measured execution time (cost EMA, recent-compute EMA)."""
        with self._ready:
            entry = self._models.get(batch.model)
            if entry is None:
                return
            key = (batch.model, batch.variant, batch.batch_size)
            old = self._costs.get(key)
            alpha = self._config.cost_ema_alpha
            self._costs[key] = seconds if old is None else old + alpha * (seconds - old)
            now = self._clock()
            entry.recent = self._decayed(entry, now) + seconds
            entry.recent_at = now

    def cost(self, model: str, variant: int, batch_size: int) -> float:
        """Cost estimate of one execution, seconds (``unseeded_cost_s`` before any measurement)."""
        with self._ready:
            return self._cost(model, variant, batch_size)

    def snapshot(self) -> SchedulerSnapshot:
        """Queue depths, shares, recent compute and cost estimates of every registered model."""
        with self._ready:
            now = self._clock()
            total = sum(self._config.weight(m) for m in self._models) or 1.0
            models = {
                name: ModelSnapshot(
                    queued=len(entry.queue),
                    queued_rows=sum(w.rows for w in entry.queue),
                    weight=self._config.weight(name),
                    share=self._config.weight(name) / total,
                    recent_compute_s=self._decayed(entry, now),
                    costs=MappingProxyType(
                        {(k[1], k[2]): v for k, v in self._costs.items() if k[0] == name}
                    ),
                )
                for name, entry in sorted(self._models.items())
            }
            return SchedulerSnapshot(self._config.discipline, models, self._shed)

    def close(self) -> None:
        """Stop: wake :meth:`next` (it returns None), refuse later submits, and shed every
        queued work with the reason "the runtime is stopping"."""
        with self._ready:
            self._closed = True
            left = [w for entry in self._models.values() for w in entry.queue]
            for entry in self._models.values():
                entry.queue.clear()
                entry.plan = None
            self._shed += len(left)
            self._ready.notify_all()
        self._report([(work, "the runtime is stopping") for work in left])

    def _report(self, shed: list[tuple[Work, str]]) -> None:
        for work, reason in shed:
            try:
                self._on_shed(work, reason)
            except Exception:  # one failed reply must not lose the others or the batch
                _log.exception("on_shed failed for a request of model %r", work.model)

    # Everything below runs with the lock held.

    def _cost(self, model: str, variant: int, batch_size: int) -> float:
        return self._costs.get((model, variant, batch_size), self._config.unseeded_cost_s)

    def _decayed(self, entry: _Model, now: float) -> float:
        elapsed = max(0.0, now - entry.recent_at)
        return entry.recent * 0.5 ** (elapsed / self._config.ema_half_life_s)

    def _shed_hopeless(self, now: float) -> list[tuple[Work, str]]:
        edf = self._config.discipline == "edf"
        shed: list[tuple[Work, str]] = []
        for name, entry in self._models.items():
            if not any(w.deadline is not None for w in entry.queue):
                continue
            keep: collections.deque[Work] = collections.deque()
            for work in entry.queue:
                reason = None
                if work.deadline is not None:
                    if now >= work.deadline:
                        reason = REASON_EXPIRED
                    elif edf and not work.committed:
                        size = _smallest_holding(work.rows, entry.sizes[work.variant])
                        estimate = self._cost(name, work.variant, size)
                        if now + estimate >= work.deadline:
                            reason = (
                                "the request's deadline cannot be met: "
                                f"{work.deadline - now:.4f} s left, execution estimated at "
                                f"{estimate:.4f} s"
                            )
                if reason is None:
                    keep.append(work)
                else:
                    shed.append((work, reason))
            if len(keep) != len(entry.queue):
                entry.queue, entry.plan = keep, None
        self._shed += len(shed)
        return shed

    def _select(self, now: float) -> Batch | None:
        contenders = [(n, e) for n, e in self._models.items() if e.queue]
        if not contenders:
            return None
        discipline = self._config.discipline
        committed = [c for c in contenders if c[1].queue[0].committed]
        if committed:  # a meta's sub-call first, the oldest one
            name = min(committed, key=lambda c: (c[1].queue[0].arrival, c[0]))[0]
        elif len(contenders) == 1:  # every discipline picks the only model with work
            name = contenders[0][0]
        elif discipline == "fifo":
            name = min(contenders, key=lambda c: (c[1].queue[0].arrival, c[0]))[0]
        elif discipline == "edf":
            inf = math.inf
            name = min(
                contenders,
                key=lambda c: (
                    min((w.deadline for w in c[1].queue if w.deadline is not None), default=inf),
                    c[1].queue[0].arrival,
                    c[0],
                ),
            )[0]
        else:
            name = self._select_fair(contenders, now)
        entry = self._models[name]
        batch = entry.planned(name)
        queue = entry.queue
        if all(queue[i] is w for i, w in enumerate(batch.works)):  # the leading run: pop it
            for _ in batch.works:
                queue.popleft()
        else:  # works of another variant sat between them: they stay queued, in order
            taken = {id(w) for w in batch.works}
            entry.queue = collections.deque(w for w in queue if id(w) not in taken)
        entry.plan = None
        return batch

    def _select_fair(self, contenders: list[tuple[str, _Model]], now: float) -> str:
        config = self._config
        total_weight = sum(config.weight(n) for n, _ in contenders)
        recent = {n: self._decayed(e, now) for n, e in contenders}
        total_recent = sum(recent.values())

        def rank(c: tuple[str, _Model]) -> tuple[float, float, str]:
            name, entry = c
            share = config.weight(name) / total_weight
            normalized = recent[name] / total_recent if total_recent > 0 else 0.0
            lead = max(-config.priority_cap, min(config.priority_cap, share - normalized))
            plan = entry.planned(name)
            cost = self._cost(name, plan.variant, plan.batch_size)
            if len(plan.works) > 1:
                cost *= 1 - config.coalescing_discount
            return (-lead / cost, entry.queue[0].arrival, name)

        return min(contenders, key=rank)[0]


def _smallest_holding(rows: int, sizes: tuple[int, ...]) -> int:
    return sizes[bisect.bisect_left(sizes, rows)]


def _plan(name: str, entry: _Model) -> Batch:
    """The batch ``entry``'s queue would run now (docs/scheduling.md, "Coalescing")."""
    head = entry.queue[0]
    sizes = entry.sizes[head.variant]
    if not entry.coalesce[head.variant]:
        return Batch(name, head.variant, _smallest_holding(head.rows, sizes), (head,), head.rows)
    same = [work for work in entry.queue if work.variant == head.variant]
    run_rows = 0
    for work in same:
        if run_rows >= sizes[-1]:
            break
        run_rows += work.rows
    i = bisect.bisect_right(sizes, run_rows)
    target = sizes[i - 1] if i else sizes[0]
    if head.rows > target:  # an oversized head grows the target; it is never split
        target = _smallest_holding(head.rows, sizes)
    taken: list[Work] = []
    items = 0
    for work in same:
        if items + work.rows > target:
            break
        taken.append(work)
        items += work.rows
    return Batch(name, head.variant, _smallest_holding(items, sizes), tuple(taken), items)
