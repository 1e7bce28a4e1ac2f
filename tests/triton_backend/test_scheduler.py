"""The runtime's scheduler (docs/scheduling.md): disciplines, shedding, coalescing, costs, threads.

Pure logic with an injected clock; no Triton, no JAX.
"""

from __future__ import annotations

import re
import threading
import time

import pytest

from hloserve import names
from hloserve.errors import InvalidArgumentError, SchedulerClosedError, Status
from hloserve.triton_backend.runtime.scheduler import (
    REASON_EXPIRED,
    Batch,
    Scheduler,
    SchedulerConfig,
    Work,
)


class Clock:
    """A settable monotonic clock, seconds."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make(discipline: str = "fair", **kwargs: object) -> tuple[Scheduler, Clock, list]:
    clock = Clock()
    shed: list[tuple[Work, str]] = []
    config = SchedulerConfig(discipline=discipline, **kwargs)  # type: ignore[arg-type]
    return Scheduler(config, lambda w, r: shed.append((w, r)), clock=clock), clock, shed


def put(s: Scheduler, clock: Clock, model: str, rows: int = 1, **kwargs: object) -> Work:
    work = Work(model, int(kwargs.pop("variant", 0)), rows, payload=object(), **kwargs)  # type: ignore[arg-type]
    s.submit(work)
    clock.advance(0.001)
    return work


def take(s: Scheduler) -> Batch:
    batch = s.next(timeout=0)
    assert batch is not None
    return batch


# --- disciplines -------------------------------------------------------------------------


def run_backlogged(s: Scheduler, clock: Clock, seconds: dict[str, float], n: int) -> dict:
    """Keep every model backlogged; execute ``n`` batches, each taking ``seconds[model]``."""
    compute = dict.fromkeys(seconds, 0.0)
    for model in seconds:
        put(s, clock, model)
        put(s, clock, model)
    for _ in range(n):
        batch = take(s)
        clock.advance(seconds[batch.model])
        s.record(batch, seconds[batch.model])
        compute[batch.model] += seconds[batch.model]
        put(s, clock, batch.model)
    total = sum(compute.values())
    return {m: c / total for m, c in compute.items()}


def test_fair_shares_compute_by_weight() -> None:
    s, clock, _ = make("fair", weights={"a": 3.0, "b": 1.0})
    for m in ("a", "b", "idle"):
        s.register(m, 0, [1])
    fractions = run_backlogged(s, clock, {"a": 0.05, "b": 0.05}, 600)
    assert fractions["a"] == pytest.approx(0.75, abs=0.03)
    assert fractions["b"] == pytest.approx(0.25, abs=0.03)


def test_fair_shares_compute_not_batches_when_costs_differ() -> None:
    s, clock, _ = make("fair")
    for m in ("slow", "fast"):
        s.register(m, 0, [1])
    fractions = run_backlogged(s, clock, {"slow": 0.08, "fast": 0.02}, 800)
    assert fractions["slow"] == pytest.approx(0.5, abs=0.05)


def test_fair_ties_go_to_the_oldest_request_then_the_name() -> None:
    s, clock, _ = make("fair")
    for m in ("a", "b", "c"):
        s.register(m, 0, [1])
    put(s, clock, "c")
    put(s, clock, "b")
    assert [take(s).model for _ in range(2)] == ["c", "b"]
    put(s, clock, "b", arrival=5.0)
    put(s, clock, "a", arrival=5.0)
    assert take(s).model == "a"


def test_fair_coalescing_discount_prefers_the_coalescing_model() -> None:
    for discount, winner in ((0.10, "batched"), (0.0, "single")):
        s, clock, _ = make("fair", coalescing_discount=discount)
        s.register("single", 0, [1, 2])
        s.register("batched", 0, [1, 2])
        put(s, clock, "single")
        put(s, clock, "batched")
        put(s, clock, "batched")
        assert take(s).model == winner


def test_fifo_serves_the_globally_oldest_request() -> None:
    s, clock, _ = make("fifo", weights={"b": 100.0})
    for m in ("a", "b", "c"):
        s.register(m, 0, [1, 2, 4])
    order = ["b", "a", "c", "a", "b"]
    for m in order:
        put(s, clock, m)
    served = []
    while (batch := s.next(timeout=0)) is not None:
        served.append(batch.model)
    # The model whose head is oldest goes first, still coalescing its queue.
    assert served == ["b", "a", "c"]
    put(s, clock, "c", arrival=1.0)
    put(s, clock, "b", arrival=1.0)
    assert take(s).model == "b"  # equal arrivals: by name


def test_edf_serves_the_soonest_deadline_and_ties_like_fifo() -> None:
    s, clock, _ = make("edf")
    for m in ("a", "b", "c"):
        s.register(m, 0, [1])
    now = clock.now
    put(s, clock, "a")  # no deadline: least urgent
    put(s, clock, "b", deadline=now + 9.0)
    put(s, clock, "b", deadline=now + 1.0)  # not at b's head: still counts for b
    put(s, clock, "c", deadline=now + 5.0)
    assert [take(s).model for _ in range(4)] == ["b", "b", "c", "a"]
    put(s, clock, "c", deadline=now + 3.0)
    put(s, clock, "a", deadline=now + 3.0)
    put(s, clock, "b")
    assert [take(s).model for _ in range(3)] == ["c", "a", "b"]


def test_edf_sheds_the_request_its_deadline_cannot_meet() -> None:
    s, clock, shed = make("edf")
    s.register("m", 0, [1, 2])
    s.record(Batch("m", 0, 1, (), 1), 0.05)
    now = clock.now
    hopeless = put(s, clock, "m", deadline=now + 0.03)
    feasible = put(s, clock, "m", deadline=now + 1.0)
    batch = take(s)
    assert batch.works == (feasible,)
    assert [w for w, _ in shed] == [hopeless]
    assert "cannot be met" in shed[0][1]


def test_unseeded_cost_gates_edf_too() -> None:
    s, clock, shed = make("edf")
    s.register("m", 0, [1])
    put(s, clock, "m", deadline=clock.now + 0.005)  # < 0.01 s unseeded estimate
    assert s.next(timeout=0) is None
    assert len(shed) == 1


@pytest.mark.parametrize("discipline", ["fair", "fifo", "edf"])
def test_expired_deadlines_are_shed_in_every_discipline(discipline: str) -> None:
    s, clock, shed = make(discipline)
    s.register("m", 0, [1, 2, 4])
    expired = put(s, clock, "m", deadline=clock.now + 0.5)
    kept = put(s, clock, "m", deadline=clock.now + 100.0)
    clock.advance(1.0)
    assert take(s).works == (kept,)
    assert shed == [(expired, REASON_EXPIRED)]
    assert s.snapshot().shed == 1


def test_fair_and_fifo_do_not_shed_by_laxity() -> None:
    for discipline in ("fair", "fifo"):
        s, clock, shed = make(discipline)
        s.register("m", 0, [1])
        work = put(s, clock, "m", deadline=clock.now + 0.005)
        assert take(s).works == (work,)
        assert shed == []


# --- coalescing --------------------------------------------------------------------------


def plan(sizes: list[int], rows: list[int], coalesce: bool = True) -> list[tuple[int, int, int]]:
    """(works, items, batch_size) of each batch the queue drains into."""
    s, clock, _ = make("fifo")
    s.register("m", 0, sizes, coalesce=coalesce)
    for r in rows:
        put(s, clock, "m", r)
    out = []
    while (batch := s.next(timeout=0)) is not None:
        assert batch.items == sum(w.rows for w in batch.works)
        out.append((len(batch.works), batch.items, batch.batch_size))
    return out


def test_coalescing_fills_the_largest_size_the_rows_fill() -> None:
    assert plan([1, 2, 4, 8], [1] * 11) == [(8, 8, 8), (2, 2, 2), (1, 1, 1)]
    assert plan([1, 4], [2, 2, 1]) == [(2, 4, 4), (1, 1, 1)]


def test_coalescing_pads_up_to_the_smallest_size_holding_the_rows() -> None:
    assert plan([4, 8], [1, 2]) == [(2, 3, 4)]
    assert plan([4, 8], [3, 3, 3]) == [(2, 6, 8), (1, 3, 4)]


def test_coalescing_never_splits_a_request() -> None:
    # The head (6 rows) is above the largest size the run fills (4): the target grows to 8.
    assert plan([4, 8], [6, 1]) == [(2, 7, 8)]
    assert plan([4, 8], [6, 1, 2]) == [(2, 7, 8), (1, 2, 4)]
    s, clock, _ = make()
    s.register("m", 0, [2, 4])
    with pytest.raises(ValueError, match=r"5 rows is outside 1\.\.4"):
        put(s, clock, "m", 5)
    with pytest.raises(ValueError, match="0 rows"):
        put(s, clock, "m", 0)


def test_coalescing_groups_by_variant_and_never_mixes_them() -> None:
    """Works of the head's variant coalesce past works of another variant, which wait their
    turn in place (interleaved variants are what mixed traffic looks like)."""
    s, clock, _ = make("fifo")
    s.register("m", 0, [1, 2, 4])
    s.register("m", 1, [1, 2, 4])
    works = [put(s, clock, "m", 1, variant=v) for v in (0, 1, 0, 1, 0)]
    batches = [take(s) for _ in range(3)]
    assert [(b.variant, b.works, b.batch_size) for b in batches] == [
        (0, (works[0], works[2]), 2),  # 3 rows of variant 0 fill size 2
        (1, (works[1], works[3]), 2),
        (0, (works[4],), 1),
    ]
    assert s.next(timeout=0) is None


def test_coalesce_false_runs_one_request_per_batch() -> None:
    assert plan([1, 2, 4], [1, 1, 2], coalesce=False) == [(1, 1, 1), (1, 1, 1), (1, 2, 2)]


def test_unknown_model_or_variant_is_refused() -> None:
    s, clock, _ = make()
    s.register("m", 0, [1])
    with pytest.raises(ValueError, match="'x' is not registered"):
        put(s, clock, "x")
    with pytest.raises(ValueError, match="no variant 3"):
        put(s, clock, "m", variant=3)
    with pytest.raises(ValueError, match="no compiled batch sizes"):
        s.register("m", 1, [])
    put(s, clock, "m", 1)
    s.register("m", 0, [1, 2])  # a second registration replaces the sizes
    put(s, clock, "m", 2)
    with pytest.raises(ValueError, match="2 rows exceed the new largest compiled size 1"):
        s.register("m", 0, [1])
    assert [take(s).items for _ in range(2)] == [1, 2]


# --- cost and recent compute -------------------------------------------------------------


def test_cost_ema_seeds_with_the_first_measurement_then_alpha_0_2() -> None:
    s, _, _ = make()
    s.register("m", 0, [1, 2])
    assert s.cost("m", 0, 2) == 0.01
    s.record(Batch("m", 0, 2, (), 2), 0.1)
    assert s.cost("m", 0, 2) == pytest.approx(0.1)
    s.record(Batch("m", 0, 2, (), 2), 0.2)
    assert s.cost("m", 0, 2) == pytest.approx(0.12)
    assert s.cost("m", 0, 1) == 0.01  # per batch size
    assert s.cost("m", 1, 2) == 0.01  # per variant
    assert s.snapshot().models["m"].costs == {(0, 2): pytest.approx(0.12)}


def test_recent_compute_halves_every_half_life() -> None:
    s, clock, _ = make(ema_half_life_s=30.0)
    s.register("m", 0, [1])
    s.record(Batch("m", 0, 1, (), 1), 1.0)
    assert s.snapshot().models["m"].recent_compute_s == pytest.approx(1.0)
    clock.advance(30.0)
    assert s.snapshot().models["m"].recent_compute_s == pytest.approx(0.5)
    clock.advance(30.0)
    s.record(Batch("m", 0, 1, (), 1), 1.0)
    assert s.snapshot().models["m"].recent_compute_s == pytest.approx(1.25)


def test_snapshot_reports_queues_and_shares() -> None:
    s, clock, _ = make(weights={"a": 3.0})
    s.register("a", 0, [1, 4])
    s.register("b", 0, [1])
    put(s, clock, "a", 3)
    put(s, clock, "a", 1)
    snap = s.snapshot()
    assert (snap.models["a"].queued, snap.models["a"].queued_rows) == (2, 4)
    assert (snap.models["a"].share, snap.models["b"].share) == (0.75, 0.25)
    assert snap.discipline == "fair"


# --- lifecycle and threads ---------------------------------------------------------------


def test_unregister_returns_the_queued_works_and_forgets_the_model() -> None:
    s, clock, _ = make()
    s.register("m", 0, [1])
    s.register("other", 0, [1])
    works = [put(s, clock, "m") for _ in range(3)]
    s.record(Batch("m", 0, 1, (), 1), 0.5)
    assert s.unregister("m") == works
    assert s.unregister("m") == []
    s.record(Batch("m", 0, 1, (), 1), 0.5)  # an execution that was in flight: ignored
    assert "m" not in s.snapshot().models
    with pytest.raises(ValueError, match="not registered"):
        put(s, clock, "m")
    s.register("m", 0, [1])
    assert s.cost("m", 0, 1) == 0.01


def test_close_wakes_next_refuses_submits_and_sheds_queued_works() -> None:
    s, clock, _ = make()
    s.register("m", 0, [1])
    results: list[object] = []
    waiter = threading.Thread(target=lambda: results.append(s.next(timeout=10)))
    waiter.start()
    time.sleep(0.05)
    s.close()
    waiter.join(timeout=5)
    assert results == [None]
    with pytest.raises(SchedulerClosedError) as info:
        put(s, clock, "m")
    assert info.value.status is Status.UNAVAILABLE
    assert s.next(timeout=0) is None

    s2, clock2, shed2 = make()
    s2.register("m", 0, [1])
    queued = put(s2, clock2, "m")
    s2.close()
    assert shed2 == [(queued, "the runtime is stopping")]


def test_next_times_out_when_nothing_is_queued() -> None:
    s, _, _ = make()
    s.register("m", 0, [1])
    start = time.monotonic()
    assert s.next(timeout=0.05) is None
    assert time.monotonic() - start >= 0.04


def test_a_failing_on_shed_loses_neither_the_other_sheds_nor_the_batch() -> None:
    clock = Clock()
    seen: list[Work] = []

    def on_shed(work: Work, reason: str) -> None:
        seen.append(work)
        if len(seen) == 1:
            raise RuntimeError("reply failed")

    s = Scheduler(SchedulerConfig(), on_shed, clock=clock)
    s.register("m", 0, [1])
    expired = [put(s, clock, "m", deadline=clock.now) for _ in range(2)]
    kept = put(s, clock, "m")
    assert take(s).works == (kept,)
    assert seen == expired


def test_producers_and_one_consumer_deliver_every_work_once_in_order() -> None:
    s = Scheduler(SchedulerConfig(), lambda w, r: None)
    models = ("a", "b", "c")
    for m in models:
        s.register(m, 0, [1, 2, 4, 8])
    producers, per_producer = 4, 300

    def produce(p: int) -> None:
        for i in range(per_producer):
            s.submit(Work(models[i % 3], 0, 1 + i % 2, payload=(p, i)))

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
    for t in threads:
        t.start()
    received: list[tuple[int, int]] = []
    deadline = time.monotonic() + 30
    while len(received) < producers * per_producer and time.monotonic() < deadline:
        batch = s.next(timeout=1.0)
        if batch is not None:
            assert batch.items <= batch.batch_size
            s.record(batch, 0.0001)
            received.extend(w.payload for w in batch.works)  # type: ignore[misc]
    for t in threads:
        t.join(timeout=5)
    assert sorted(received) == [(p, i) for p in range(producers) for i in range(per_producer)]
    for p in range(producers):  # each producer's works of one model stay in order
        for k in range(3):
            mine = [i for q, i in received if q == p and i % 3 == k]
            assert mine == sorted(mine)
    s.close()


# --- configuration and deadlines ---------------------------------------------------------


def test_config_from_parameters() -> None:
    assert SchedulerConfig.from_parameters({}) == SchedulerConfig()
    config = SchedulerConfig.from_parameters(
        {names.PARAM_SCHEDULING: "EDF", names.PARAM_MODEL_WEIGHTS: "a=3, b=0.5", "x": "y"}
    )
    assert config.discipline == "edf"
    assert dict(config.weights) == {"a": 3.0, "b": 0.5}
    assert config.weight("c") == 1.0
    with pytest.raises(InvalidArgumentError, match=r"hloserve\.scheduling.*got 'lifo'"):
        SchedulerConfig.from_parameters({names.PARAM_SCHEDULING: "lifo"})
    for bad in ("a=0", "a=-1", "a=x", "a", "a=1,a=2", "a=inf"):
        with pytest.raises(
            InvalidArgumentError, match=rf"model_weights.*got {re.escape(repr(bad))}"
        ):
            SchedulerConfig.from_parameters({names.PARAM_MODEL_WEIGHTS: bad})


def test_config_ranges_are_checked() -> None:
    for field, value in (
        ("ema_half_life_s", 0.0),
        ("priority_cap", 1.5),
        ("coalescing_discount", 1.0),
        ("unseeded_cost_s", 0.0),
        ("cost_ema_alpha", 0.0),
    ):
        with pytest.raises(ValueError, match=field):
            SchedulerConfig(**{field: value})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="weight of model 'a'"):
        SchedulerConfig(weights={"a": 0.0})


# --- committed works (a meta's sub-calls) --------------------------------------------------


def test_a_committed_work_jumps_its_models_queue_and_is_served_first() -> None:
    s, clock, _ = make("fifo")
    s.register("a", 0, [1])
    s.register("b", 0, [1])
    older = [put(s, clock, "b"), put(s, clock, "a"), put(s, clock, "a")]
    first = put(s, clock, "a", committed=True)
    second = put(s, clock, "a", committed=True)
    order = [take(s).works[0] for _ in range(5)]
    assert order == [first, second, older[0], older[1], older[2]]


def test_a_committed_work_escapes_the_edf_laxity_drop_not_its_deadline() -> None:
    s, clock, shed = make("edf", unseeded_cost_s=0.5)
    s.register("a", 0, [1])
    plain = put(s, clock, "a", deadline=clock.now + 0.1)
    committed = put(s, clock, "a", deadline=clock.now + 0.1, committed=True)
    assert take(s).works == (committed,)  # 0.1 s left < the 0.5 s estimate: kept all the same
    assert [w for w, _ in shed] == [plain]
    late = put(s, clock, "a", deadline=clock.now + 0.01, committed=True)
    clock.advance(0.02)
    assert s.next(timeout=0) is None
    assert shed[-1] == (late, REASON_EXPIRED)


def test_a_committed_head_coalesces_with_the_models_other_works() -> None:
    s, clock, _ = make("fair")
    s.register("a", 0, [1, 2, 4])
    plain = [put(s, clock, "a") for _ in range(3)]
    committed = put(s, clock, "a", committed=True)
    batch = take(s)  # 4 rows fill the compiled size 4 (docs/scheduling.md, "Coalescing")
    assert batch.works == (committed, *plain) and batch.batch_size == 4
