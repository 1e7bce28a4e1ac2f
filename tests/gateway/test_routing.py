"""Router and schedulers (docs/gateway.md, "Routing")."""

from __future__ import annotations

import threading

import pytest

from hloserve.errors import GRPC_CODE, Status
from hloserve.gateway.config import GatewayConfig, SchedulingConfig
from hloserve.gateway.routing import (
    LeastOutstandingScheduler,
    LptPackingScheduler,
    ModelRoute,
    RoundRobinScheduler,
    Router,
    RoutingTable,
    make_scheduler,
)


def _lpt(**knobs: object) -> LptPackingScheduler:
    return LptPackingScheduler(SchedulingConfig.model_validate(knobs))


def test_round_robin_rotates_and_fails_over_in_rotation() -> None:
    """Uniform rotation over a model's replicas."""
    router = Router(RoundRobinScheduler(), RoutingTable({"m": ModelRoute(("a", "b", "c"))}))
    leases = [router.acquire("m") for _ in range(4)]
    assert [lease.worker for lease in leases] == ["a", "b", "c", "a"]
    assert leases[1].order == ("b", "c", "a")


def test_unknown_model_is_not_found_and_empty_route_unavailable() -> None:
    """No replica -> an error whose status maps to the gRPC code."""
    router = Router(RoundRobinScheduler(), RoutingTable({"m": ModelRoute(())}))
    with pytest.raises(Exception, match="not served by any worker") as info:
        router.acquire("nope")
    assert GRPC_CODE[info.value.status] == 5  # type: ignore[attr-defined]
    with pytest.raises(Exception, match="no ready replica") as info:
        router.acquire("m")
    assert info.value.status is Status.UNAVAILABLE  # type: ignore[attr-defined]


def test_no_route_error_names_each_workers_reason() -> None:
    from hloserve.gateway.health import restrict_to_healthy

    table = RoutingTable(
        {"m": ModelRoute(("a", "b"))},
        unready={"f": {"a": "reports UNAVAILABLE: load failed"}},
    )
    router = Router(RoundRobinScheduler(), restrict_to_healthy(table, frozenset({"a", "b"})))
    with pytest.raises(Exception, match="model 'm' has no ready replica: worker a unreachable"):
        router.acquire("m")
    with pytest.raises(Exception, match="'f' has no ready replica: worker a reports UNAVAIL"):
        router.acquire("f")
    with pytest.raises(Exception, match="not served by any worker"):
        router.acquire("nope")
    down = RoutingTable(unreachable={"c": "RepositoryIndex failed: UNAVAILABLE"})
    error = down.no_route_error("nope")
    assert error.status is Status.UNAVAILABLE
    assert "not listed by any reachable worker; unreachable: c (RepositoryIndex" in error.message


def test_failover_moves_the_charge_and_release_is_idempotent() -> None:
    """Replicas are tried in order: the chosen one, then the rest least backed up first."""
    router = Router(LeastOutstandingScheduler(), RoutingTable({"m": ModelRoute(("a", "b", "c"))}))
    busy = router.acquire("m", items=5)  # a
    assert busy.worker == "a"
    lease = router.acquire("m", items=2)  # b (least work), then c (idle), then a (5 items)
    assert lease.order == ("b", "c", "a")
    assert router.fail_over(lease) == "c"
    assert router.outstanding("m", "b") == 0 and router.outstanding("m", "c") == 2
    assert router.fail_over(lease) == "a"
    assert router.outstanding("m", "a") == 7
    assert router.fail_over(lease) is None
    assert lease.released
    assert router.outstanding("m", "a") == 5
    router.release(lease)  # no double free
    router.release(busy)
    router.release(busy)
    assert router.worker_items(["a", "b", "c"]) == {"a": 0, "b": 0, "c": 0}
    assert router.routed() == {("m", "a"): 2, ("m", "b"): 1, ("m", "c"): 1}


def test_least_outstanding_compares_compute_not_items() -> None:
    """Rows 67-68: work = items x measured cost per item, over every model on the worker."""
    table = RoutingTable(
        {
            "slow": ModelRoute(("a", "b"), cost_per_item_seconds=1.0),
            "fast": ModelRoute(("a", "b"), cost_per_item_seconds=0.01),
        }
    )
    router = Router(LeastOutstandingScheduler(), table)
    assert router.acquire("slow").worker == "a"  # 1.0 s on a
    assert router.acquire("fast", items=10).worker == "b"  # 0.1 s on b
    assert router.acquire("fast", items=10).worker == "b"  # b 0.1 < a 1.0
    assert router.acquire("fast", items=10).worker == "b"  # 0.2 < 1.0, though b has 20 items


def test_unmeasured_model_costs_the_fleet_mean() -> None:
    """An unpolled model is charged the fleet-mean cost per item."""
    table = RoutingTable(
        {
            "x": ModelRoute(("a",), cost_per_item_seconds=0.2),
            "y": ModelRoute(("a",), cost_per_item_seconds=0.4),
            "new": ModelRoute(("a",)),
        }
    )
    assert table.cost_per_item("new") == pytest.approx(0.3)
    assert RoutingTable({"n": ModelRoute(("a",))}).cost_per_item("n") == 1.0
    lease = Router(RoundRobinScheduler(), table).acquire("new", items=0)
    assert lease.items == 1  # no batch axis = 1 item
    assert lease.work == pytest.approx(0.3)


def test_run_fills_one_replica_before_the_next() -> None:
    """Run mode spends Q = max batch x fill factor items on one replica."""
    router = Router(_lpt(), RoutingTable({"m": ModelRoute(("a", "b"), max_batch=4)}))
    workers = [router.acquire("m").worker for _ in range(8)]  # all held in flight
    assert workers == ["a"] * 4 + ["b"] * 4


def test_fill_quantum_counts_items_and_the_fill_factor() -> None:
    """The quantum is in items, not requests; per-model factor overrides."""
    scheduler = _lpt(routing_fill_factor=2.0, models={"m": {"fill_factor": 0.5}})
    table = RoutingTable({"m": ModelRoute(("a", "b"), max_batch=8), "n": ModelRoute(("a",), 8)})
    assert scheduler.fill_quantum("m", table.routes["m"]) == 4
    assert scheduler.fill_quantum("n", table.routes["n"]) == 16
    router = Router(scheduler, table)
    assert [router.acquire("m", items=3).worker for _ in range(3)] == ["a", "a", "b"]


def test_run_ends_when_nothing_is_in_flight() -> None:
    """A run also ends when its replica has drained; a drained fleet rotates."""
    router = Router(_lpt(), RoutingTable({"m": ModelRoute(("a", "b"), max_batch=4)}))
    seen = []
    for _ in range(4):
        lease = router.acquire("m")
        seen.append(lease.worker)
        router.release(lease)
    assert seen == ["a", "b", "a", "b"]


def test_run_ends_when_its_replica_is_a_whole_quantum_behind() -> None:
    """A run ends when its replica holds Q more items than the least loaded sibling."""
    router = Router(
        _lpt(routing_policy="fill_rr"), RoutingTable({"m": ModelRoute(("a", "b"), max_batch=4)})
    )
    assert router.acquire("m", items=4).worker == "a"  # run on a, closed at 4
    on_b = router.acquire("m", items=4)
    assert on_b.worker == "b"  # next run opens by rotation
    assert router.acquire("m").worker == "a"  # rotation again: a holds 5, b 4
    router.release(on_b)  # b drains: a is now 5 items (> Q) ahead of b
    assert router.acquire("m").worker == "b"


def test_fill_least_opens_on_the_least_loaded_worker() -> None:
    """``fill_least`` looks at in-flight work of every model; fill_rr is load-blind."""
    routes = {
        "other": ModelRoute(("a",), max_batch=8, cost_per_item_seconds=0.1),
        "m": ModelRoute(("a", "b"), max_batch=4, cost_per_item_seconds=0.1),
    }
    least = Router(_lpt(), RoutingTable(routes))
    least.acquire("other", items=5)
    assert least.acquire("m").worker == "b"
    rr = Router(_lpt(routing_policy="fill_rr"), RoutingTable(routes))
    rr.acquire("other", items=5)
    assert rr.acquire("m").worker == "a"


def test_drained_fleet_compares_equal_despite_float_residue() -> None:
    """After charges and releases of 0.1 s amounts, idle workers tie and rotate."""
    routes = {"m": ModelRoute(("a", "b"), max_batch=64, cost_per_item_seconds=0.1)}
    router = Router(_lpt(), RoutingTable(routes))
    leases = [router.acquire("m", items=n) for n in (1, 2, 3)]
    for lease in leases:
        router.release(lease)
    opened = []
    for _ in range(4):
        lease = router.acquire("m")
        opened.append(lease.worker)
        router.release(lease)
    assert sorted(opened) == ["a", "a", "b", "b"]


def test_spread_equalizes_in_flight_items() -> None:
    """Spread sends each request to the replica with the fewest in-flight items."""
    router = Router(
        _lpt(routing_fill_mode="spread"), RoutingTable({"m": ModelRoute(("a", "b"), max_batch=4)})
    )
    assert router.acquire("m", items=3).worker == "a"
    assert [router.acquire("m").worker for _ in range(3)] == ["b", "b", "b"]
    assert {router.acquire("m").worker, router.acquire("m").worker} == {"a", "b"}


def test_unknown_max_batch_degrades_to_rotation() -> None:
    """No max batch, no quantum: rotate."""
    router = Router(_lpt(), RoutingTable({"m": ModelRoute(("a", "b"))}))
    assert [router.acquire("m").worker for _ in range(4)] == ["a", "b", "a", "b"]


def test_table_swap_is_atomic_and_drops_stale_runs() -> None:
    """The table is replaced whole; leases from the old table still release."""
    router = Router(_lpt(), RoutingTable({"m": ModelRoute(("a", "b"), max_batch=4)}))
    old = router.acquire("m")
    assert old.worker == "a"
    router.swap_table(RoutingTable({"m": ModelRoute(("b", "c"), max_batch=4)}))
    assert router.acquire("m").worker in {"b", "c"}
    router.release(old)
    assert router.outstanding("m", "a") == 0
    router.swap_table(RoutingTable())
    with pytest.raises(Exception, match="not served"):
        router.acquire("m")


def test_concurrent_acquire_release_keeps_counts_exact() -> None:
    """The router is shared by threads: no lost updates."""
    router = Router(_lpt(), RoutingTable({"m": ModelRoute(("a", "b", "c"), max_batch=8)}))

    def loop() -> None:
        for i in range(300):
            lease = router.acquire("m", items=1 + i % 3)
            if i % 5 == 0:
                router.fail_over(lease)
            router.release(lease)

    threads = [threading.Thread(target=loop) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert router.worker_items(["a", "b", "c"]) == {"a": 0, "b": 0, "c": 0}
    assert sum(router.routed().values()) == 4 * (300 + 60)


@pytest.mark.parametrize(
    ("mode", "cls"),
    [
        ("round_robin", RoundRobinScheduler),
        ("least_outstanding", LeastOutstandingScheduler),
        ("lpt_packing", LptPackingScheduler),
    ],
)
def test_make_scheduler_follows_the_mode(mode: str, cls: type) -> None:
    config = GatewayConfig.model_validate({"workers": ["127.0.0.1:8101"], "mode": mode})
    assert isinstance(make_scheduler(config), cls)


def test_run_share_guard_keeps_replicas_within_a_quantum() -> None:
    """fill_least alone keeps opening runs on the idler worker; the guard bounds the drift."""
    table = RoutingTable(
        {"m": ModelRoute(("a", "b"), max_batch=4), "busy": ModelRoute(("b",), max_batch=4)}
    )
    scheduler = _lpt()
    router = Router(scheduler, table)
    router.acquire("busy", items=100)  # b's worker stays loaded: fill_least prefers a
    seen = []
    for _ in range(24):  # each request drains before the next: every run ends at once
        lease = router.acquire("m")
        seen.append(lease.worker)
        router.release(lease)
    assert seen[:4] == ["a"] * 4  # a opens while within a quantum of b ...
    assert seen[4] == "b"  # ... then b must take its share
    assert abs(seen.count("a") - seen.count("b")) <= 4
    assert scheduler.served("m", table.routes["m"]) == {"a": seen.count("a"), "b": seen.count("b")}
    # A new replica set starts the count afresh.
    moved = ModelRoute(("a", "c"), max_batch=4)
    assert scheduler.served("m", moved) == {"a": 0, "c": 0}
