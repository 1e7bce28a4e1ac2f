"""The lpt_packing control loop: statistics -> EWMAs -> repack -> table (docs/gateway.md)."""

from __future__ import annotations

import pytest

from hloserve.gateway.config import SchedulingConfig
from hloserve.gateway.packing import Counters, LptController, WeightInfo, weights_from_metrics
from hloserve.gateway.placement import ModelLoad, WorkerCapacity, compute_placement
from hloserve.gateway.routing import ModelRoute, RoutingTable

WORKERS = ("w0", "w1")


def _discovered(*models: str) -> RoutingTable:
    return RoutingTable({m: ModelRoute(WORKERS, max_batch=8) for m in models})


def _counters(**per_model: tuple[int, float]) -> dict[tuple[str, str], Counters]:
    """Cumulative counters, all on w0 (where a model is served does not matter to its EWMA)."""
    return {(m, "w0"): Counters(items, seconds) for m, (items, seconds) in per_model.items()}


def test_first_tick_places_every_model_with_its_replica_count() -> None:
    """Replicas per model come from the config; every model is placed at startup."""
    controller = LptController(SchedulingConfig(models={"a": {"replicas": 2}}))
    table = controller.tick(_discovered("a", "b", "c"), {}, 1.0)
    assert sorted(table.routes["a"].replicas) == ["w0", "w1"]
    assert len(table.routes["b"].replicas) == 1
    assert len(table.routes["c"].replicas) == 1
    # cold models of unknown weight spread instead of piling on the first worker
    assert table.routes["b"].replicas != table.routes["c"].replicas
    assert table.routes["a"].max_batch == 8


def test_cold_models_spread_over_workers() -> None:
    placement = compute_placement(
        [ModelLoad(n) for n in "abcd"], [WorkerCapacity("w0"), WorkerCapacity("w1")]
    )
    assert [placement.assignment[n] for n in "abcd"] == [("w0",), ("w1",), ("w0",), ("w1",)]


def test_observe_measures_rate_and_cost_per_item() -> None:
    """Cost per item = delta compute seconds / delta items."""
    controller = LptController(SchedulingConfig())
    assert controller.observe(_counters(a=(50, 0.5)), 10.0) == 0.0  # baseline only
    assert controller.observe(_counters(a=(150, 1.5)), 10.0) == pytest.approx(1.0)
    rate, cost = controller.estimates()["a"]
    assert rate == pytest.approx(10.0) and cost == pytest.approx(0.01)


def test_a_counter_reset_counts_as_a_fresh_start() -> None:
    controller = LptController(SchedulingConfig())
    controller.observe(_counters(a=(1000, 10.0)), 1.0)
    assert controller.observe(_counters(a=(20, 0.4)), 2.0) == pytest.approx(0.4)
    assert controller.estimates()["a"] == (pytest.approx(10.0), pytest.approx(0.02))


def test_ewma_weighs_new_samples_by_fleet_compute() -> None:
    """The EWMA decays against fleet compute seconds (half-life = rebalance budget)."""
    controller = LptController(SchedulingConfig(rebalance_compute_seconds=1.0))
    controller.observe(_counters(a=(0, 0.0)), 1.0)
    controller.observe(_counters(a=(100, 1.0)), 1.0)  # first sample: rate 100
    controller.observe(_counters(a=(300, 2.0)), 1.0)  # 1 s of compute = one half-life
    rate, cost = controller.estimates()["a"]
    assert rate == pytest.approx(150.0)  # halfway from 100 to 200
    assert cost == pytest.approx(0.0075)  # halfway from 0.01 to 0.005


def test_traffic_repack_separates_the_heavy_models() -> None:
    """Rows 69, 71: after the compute budget, heavy models are spread heaviest first."""
    controller = LptController(
        SchedulingConfig(rebalance_compute_seconds=1.0, first_rebalance_compute_seconds=0)
    )
    discovered = _discovered("a", "b", "c")
    table = controller.tick(discovered, _counters(a=(0, 0), b=(0, 0), c=(0, 0)), 1.0)
    assert table.routes["a"].replicas == table.routes["c"].replicas == ("w0",)  # cold start
    assert controller.clock.repacks == 0
    busy = _counters(a=(100, 1.0), b=(1, 0.001), c=(100, 1.0))
    table = controller.tick(discovered, busy, 1.0)
    assert controller.clock.repacks == 1
    assert table.routes["a"].replicas != table.routes["c"].replicas
    assert table.routes["a"].cost_per_item_seconds == pytest.approx(0.01)
    assert controller.placement is not None and controller.placement.moved != ()


def test_idle_fleet_keeps_its_placement() -> None:
    controller = LptController(SchedulingConfig(rebalance_compute_seconds=1.0))
    discovered = _discovered("a", "b")
    first = controller.tick(discovered, _counters(a=(5, 0.1)), 1.0)
    placement = controller.placement
    again = controller.tick(discovered, _counters(a=(5, 0.1)), 1.0)
    assert controller.placement is placement
    assert again.routes == first.routes


def test_a_new_model_or_worker_triggers_a_repack() -> None:
    controller = LptController(SchedulingConfig())
    controller.tick(_discovered("a"), {}, 1.0)
    table = controller.tick(_discovered("a", "b"), {}, 1.0)
    assert "b" in table.routes and len(table.routes["b"].replicas) == 1


def test_placed_worker_gone_falls_back_to_discovered_replicas() -> None:
    controller = LptController(SchedulingConfig())
    controller.tick(RoutingTable({"a": ModelRoute(("w0",)), "b": ModelRoute(("w1",))}), {}, 1.0)
    # the set of workers is unchanged, but a moved: route over what discovery says
    table = controller.tick(
        RoutingTable({"a": ModelRoute(("w1",)), "b": ModelRoute(("w0",))}), {}, 1.0
    )
    assert table.routes["a"].replicas == ("w1",)
    assert table.routes["b"].replicas == ("w0",)


METRICS = """# HELP hloserve_weight_cache_budget_bytes budget
hloserve_weight_cache_budget_bytes 100
hloserve_weight_bytes{model="a",residency="unpinned"} 60
hloserve_weight_bytes{model="b",residency="unpinned"} 50
"""


def test_weights_from_metrics() -> None:
    """Footprints and budgets come from the runtime's hloserve_weight_* series."""
    info = weights_from_metrics(
        {"w0": METRICS, "w1": METRICS.replace("} 50", "} 55"), "w2": "nv_inference_count 1\n"}
    )
    assert dict(info.model_bytes) == {"a": 60, "b": 55}
    assert dict(info.budget_bytes) == {"w0": 100, "w1": 100}


def test_weights_keep_models_within_budget() -> None:
    """Models b and c (60 bytes each) would share w1 on compute alone; budgets forbid it."""
    knobs = SchedulingConfig(rebalance_compute_seconds=0.1, first_rebalance_compute_seconds=0)
    start = _counters(a=(0, 0.0), b=(0, 0.0), c=(0, 0.0))
    busy = _counters(a=(100, 1.0), b=(10, 0.1), c=(10, 0.1))
    info = WeightInfo({"a": 10, "b": 60, "c": 60}, {"w0": 100, "w1": 100})

    blind = LptController(knobs)
    blind.tick(_discovered("a", "b", "c"), start, 1.0)
    table = blind.tick(_discovered("a", "b", "c"), busy, 1.0)
    assert table.routes["b"].replicas == table.routes["c"].replicas

    aware = LptController(knobs)
    aware.tick(_discovered("a", "b", "c"), start, 1.0, info)
    table = aware.tick(_discovered("a", "b", "c"), busy, 1.0, info)
    assert table.routes["b"].replicas != table.routes["c"].replicas
    assert aware.placement is not None
    assert max(aware.placement.weight_bytes.values()) <= 100


def test_the_runtime_model_is_neither_measured_nor_placed() -> None:
    """hloserve_runtime serves every front model over BLS: its time is inside theirs."""
    controller = LptController(SchedulingConfig())
    discovered = RoutingTable(
        {
            "a": ModelRoute(("w0", "w1", "w2"), max_batch=8),
            "b": ModelRoute(("w0", "w1", "w2"), max_batch=8),
            "hloserve_runtime": ModelRoute(("w0", "w1", "w2"), max_batch=8),
        }
    )
    controller.tick(discovered, _counters(a=(0, 0.0), hloserve_runtime=(0, 0.0)), 1.0)
    fleet = controller.observe(_counters(a=(100, 1.0), hloserve_runtime=(100, 0.9)), 1.0)
    assert fleet == pytest.approx(1.0)
    assert "hloserve_runtime" not in controller.estimates()
    table = controller.repack_now()
    assert controller.placement is not None
    assert "hloserve_runtime" not in controller.placement.assignment
    assert table.routes["hloserve_runtime"].replicas == ("w0", "w1", "w2")
    assert len(table.routes["a"].replicas) == 1


def test_knob_changes_reach_the_clock_and_the_next_repack() -> None:
    controller = LptController(SchedulingConfig(rebalance_compute_seconds=10.0))
    assert controller.repack_now().routes == {}  # nothing discovered yet
    controller.tick(_discovered("a", "b"), {}, 1.0)
    assert controller.repacks == 1
    controller.clock.advance(3.0)
    controller.update_scheduling(
        SchedulingConfig(
            rebalance_compute_seconds=20.0,
            first_rebalance_compute_seconds=0,
            models={"a": {"replicas": 2}},
        )
    )
    assert controller.clock.budget_seconds == 20.0
    assert controller.clock.accumulated_seconds == 3.0
    assert len(controller.tick(_discovered("a", "b"), {}, 1.0).routes["a"].replicas) == 1
    assert sorted(controller.repack_now().routes["a"].replicas) == ["w0", "w1"]
    assert controller.repacks == 2


def test_a_new_model_goes_where_the_placement_puts_it() -> None:
    """``place_new``: a model no worker holds (explicit load through the gateway) goes to the
    least loaded worker(s) of the current placement, with its configured replicas; the
    runtime model and an empty fleet get every candidate; the placement itself is unchanged
    until the next tick."""
    controller = LptController(SchedulingConfig(models={"wide": {"replicas": 2}}))
    controller.tick(_discovered("a", "b", "c"), {}, 1.0)
    assert controller.placement is not None
    before = dict(controller.placement.assignment)
    held = {w: sum(w in ws for ws in before.values()) for w in WORKERS}
    lighter = min(WORKERS, key=lambda w: (held[w], WORKERS.index(w)))
    assert controller.place_new("new", WORKERS) == (lighter,)
    assert sorted(controller.place_new("wide", WORKERS)) == ["w0", "w1"]
    assert controller.place_new("new", ("w1",)) == ("w1",)  # w0 unhealthy: not a candidate
    assert controller.place_new("hloserve_runtime", WORKERS) == WORKERS
    assert controller.place_new("new", ()) == ()
    assert dict(controller.placement.assignment) == before
    # by memory: with weights reported, a heavy resident model pushes the new one away
    info = WeightInfo({"a": 90, "b": 1, "c": 1, "new": 20}, {"w0": 100, "w1": 100})
    heavy = LptController(SchedulingConfig())
    heavy.tick(_discovered("a", "b", "c"), {}, 1.0, info)
    assert heavy.placement is not None
    home_of_a = heavy.placement.assignment["a"][0]
    (chosen,) = heavy.place_new("new", WORKERS)
    assert chosen != home_of_a
