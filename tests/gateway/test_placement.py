"""lpt_packing placement and repack cadence (docs/gateway.md, "Placement (lpt_packing)")."""

from __future__ import annotations

import pytest

from hloserve.gateway.placement import (
    ModelLoad,
    RepackClock,
    WorkerCapacity,
    compute_placement,
)

W3 = [WorkerCapacity("w0"), WorkerCapacity("w1"), WorkerCapacity("w2")]


def test_replica_counts_on_distinct_workers() -> None:
    """k = clamp(replicas, 1, N) distinct workers; 'all' = every worker."""
    placement = compute_placement(
        [
            ModelLoad("two", arrival_rate=10, cost_per_item_seconds=0.01, replicas=2),
            ModelLoad("all", arrival_rate=5, cost_per_item_seconds=0.01, replicas="all"),
            ModelLoad("one", arrival_rate=1, cost_per_item_seconds=0.01),
            ModelLoad("many", arrival_rate=1, cost_per_item_seconds=0.01, replicas=7),
        ],
        W3,
    )
    a = placement.assignment
    assert len(a["two"]) == 2 and len(set(a["two"])) == 2
    assert sorted(a["all"]) == ["w0", "w1", "w2"]
    assert len(a["one"]) == 1
    assert sorted(a["many"]) == ["w0", "w1", "w2"]
    assert any("many: 7 replicas asked, 3 workers exist" in w for w in placement.warnings)


def _max_over_mean(shares: dict[str, float]) -> float:
    values = list(shares.values())
    return max(values) / (sum(values) / len(values))


def test_heaviest_first_beats_round_robin_placement() -> None:
    """Heaviest first onto the least-pressured worker (Graham's LPT)."""
    rates = {"a": 6, "b": 3, "c": 3, "d": 5, "e": 3, "f": 4}
    models = [ModelLoad(n, arrival_rate=r, cost_per_item_seconds=0.1) for n, r in rates.items()]
    placement = compute_placement(models, W3)
    lpt = _max_over_mean(dict(placement.compute_share))
    round_robin = {"w0": 0.0, "w1": 0.0, "w2": 0.0}
    for i, name in enumerate(sorted(rates)):
        round_robin[f"w{i % 3}"] += rates[name] * 0.1
    assert lpt == pytest.approx(0.9 / 0.8)
    assert lpt < _max_over_mean(round_robin)
    # heaviest first: the three heaviest models open the three workers
    assert {placement.assignment[n][0] for n in ("a", "d", "f")} == {"w0", "w1", "w2"}


def test_replica_is_charged_a_share_of_compute_and_all_of_its_weight() -> None:
    """Compute u/k per replica, the full weight footprint on each."""
    workers = [WorkerCapacity("w0", weight_budget_bytes=100), WorkerCapacity("w1", 100)]
    placement = compute_placement(
        [ModelLoad("m", arrival_rate=10, cost_per_item_seconds=0.08, weight_bytes=30, replicas=2)],
        workers,
    )
    assert placement.compute_share == {"w0": pytest.approx(0.4), "w1": pytest.approx(0.4)}
    assert placement.weight_bytes == {"w0": 30, "w1": 30}


def _memory_fleet(c_weight: int) -> list[ModelLoad]:
    return [
        ModelLoad("a", arrival_rate=20, cost_per_item_seconds=0.1, weight_bytes=0),
        ModelLoad("b", arrival_rate=1, cost_per_item_seconds=0.1, weight_bytes=9),
        ModelLoad("c", arrival_rate=1, cost_per_item_seconds=0.1, weight_bytes=c_weight),
    ]


def test_memory_dimension_and_forbid_oversubscription() -> None:
    """Pressure = max(compute, memory / budget); forbid_memory_oversubscription.

    w0 is busy with compute (a: 2.0), w1 holds 9 of its 10 bytes (b). c (2 bytes) is less
    pressured on w1 (max(0.2, 1.1)) than on w0 (2.1), but only w0 has room for it.
    """
    workers = [WorkerCapacity("w0", 10), WorkerCapacity("w1", 10)]
    allowed = compute_placement(_memory_fleet(2), workers, forbid_memory_oversubscription=False)
    assert allowed.assignment == {"a": ("w0",), "b": ("w1",), "c": ("w1",)}
    assert any("worker w1: 11 bytes" in w for w in allowed.warnings)
    forbidden = compute_placement(_memory_fleet(2), workers)
    assert forbidden.assignment == {"a": ("w0",), "b": ("w1",), "c": ("w0",)}
    assert forbidden.warnings == ()


def test_infeasible_memory_is_placed_with_a_warning() -> None:
    """When no worker has room the model is placed anyway and a warning says so."""
    workers = [WorkerCapacity("w0", 10), WorkerCapacity("w1", 10)]
    placement = compute_placement(_memory_fleet(11), workers)
    assert len(placement.assignment["c"]) == 1
    assert any("c: no worker has room for 11 bytes" in w for w in placement.warnings)
    assert any("over a budget of 10" in w for w in placement.warnings)


def test_zero_budget_is_unconstrained() -> None:
    placement = compute_placement(
        [ModelLoad("big", weight_bytes=10**12)], [WorkerCapacity("w0", weight_budget_bytes=0)]
    )
    assert placement.assignment == {"big": ("w0",)}
    assert placement.warnings == ()


def test_cold_models_are_packed_by_memory() -> None:
    """Models with u = 0 go where the memory share stays lowest."""
    workers = [WorkerCapacity("w0", 100), WorkerCapacity("w1", 100)]
    placement = compute_placement(
        [
            ModelLoad("x", weight_bytes=60),
            ModelLoad("y", weight_bytes=50),
            ModelLoad("z", weight_bytes=40),
        ],
        workers,
    )
    assert placement.assignment == {"x": ("w0",), "y": ("w1",), "z": ("w1",)}


def test_hysteresis_keeps_placements_stable() -> None:
    """A model keeps its worker unless another improves pressure by > hysteresis."""
    workers = [WorkerCapacity("w0"), WorkerCapacity("w1")]
    models = [
        ModelLoad("a", arrival_rate=5, cost_per_item_seconds=0.1),
        ModelLoad("b", arrival_rate=4, cost_per_item_seconds=0.1),
    ]
    previous = {"a": ("w0",), "b": ("w0",)}
    moving = compute_placement(models, workers, previous=previous, hysteresis=0.0)
    assert moving.assignment == {"a": ("w0",), "b": ("w1",)}
    assert moving.moved == ("b",)
    assert moving.held_by_hysteresis == ()
    # b on w0: pressure 0.9; on w1: 0.4. 0.9 x (1 - 0.6) = 0.36 <= 0.4 -> stays.
    held = compute_placement(models, workers, previous=previous, hysteresis=0.6)
    assert held.assignment == {"a": ("w0",), "b": ("w0",)}
    assert held.moved == ()
    assert held.held_by_hysteresis == ("b",)


def test_hysteresis_zero_keeps_home_on_ties() -> None:
    workers = [WorkerCapacity("w0"), WorkerCapacity("w1")]
    placement = compute_placement(
        [ModelLoad("a", arrival_rate=1, cost_per_item_seconds=0.1)],
        workers,
        previous={"a": ("w1",)},
    )
    assert placement.assignment == {"a": ("w1",)}
    assert placement.held_by_hysteresis == ()


@pytest.mark.parametrize(
    ("kwargs", "workers", "match"),
    [
        ({}, [], "at least one worker"),
        ({}, [WorkerCapacity("w"), WorkerCapacity("w")], "duplicate worker names"),
        ({"hysteresis": 1.0}, [WorkerCapacity("w")], "hysteresis"),
    ],
)
def test_bad_arguments(kwargs: dict[str, float], workers: list[WorkerCapacity], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        compute_placement([ModelLoad("m")], workers, **kwargs)


def test_repack_clock_counts_fleet_compute_seconds() -> None:
    """First traffic-driven repack after 60 s, then every 300 s; idle never repacks."""
    clock = RepackClock(300.0, first_rebalance_compute_seconds=60.0)
    assert clock.budget_seconds == 60.0
    assert not clock.advance(0.0)
    assert not clock.advance(-5.0)  # a worker restart resets its counters: not traffic
    assert not clock.advance(59.0)
    assert clock.advance(1.0)
    assert clock.repacks == 1 and clock.accumulated_seconds == 0.0
    assert clock.budget_seconds == 300.0
    assert not clock.advance(299.0)
    assert clock.advance(1.0)


def test_repack_clock_without_a_first_budget() -> None:
    clock = RepackClock(10.0)
    assert clock.budget_seconds == 10.0
    assert clock.advance(10.0)
    with pytest.raises(ValueError, match="rebalance_compute_seconds"):
        RepackClock(0.0)
    with pytest.raises(ValueError, match="first_rebalance_compute_seconds"):
        RepackClock(1.0, -1.0)
