"""The routing table, its errors and the router's counts (docs/gateway.md, "Routing"); the
replica choice is HAProxy's (tests/gateway/test_haproxy.py)."""

from __future__ import annotations

from hloserve.errors import GRPC_CODE, Status
from hloserve.gateway.config import GatewayConfig, SchedulingConfig
from hloserve.gateway.dataplane import fill_quantum, plan_layout
from hloserve.gateway.routing import ModelRoute, Router, RoutingTable, restrict_to_healthy


def test_unknown_model_is_not_found_and_empty_route_unavailable() -> None:
    """No replica -> an error whose status maps to the gRPC code."""
    table = RoutingTable({"m": ModelRoute(())})
    missing = table.no_route_error("nope")
    assert missing.message == "Request for unknown model: 'nope' is not found"  # Triton's
    assert GRPC_CODE[missing.status] == 5
    empty = table.no_route_error("m")
    assert "no ready replica" in empty.message and empty.status is Status.UNAVAILABLE


def test_no_route_error_names_each_workers_reason() -> None:
    table = RoutingTable(
        {"m": ModelRoute(("a", "b"))},
        unready={"f": {"a": "reports UNAVAILABLE: load failed"}},
    )
    healthy = restrict_to_healthy(table, frozenset({"a", "b"}))
    assert "model 'm' has no ready replica: worker a unreachable" in (
        healthy.no_route_error("m").message
    )
    failed = healthy.no_route_error("f")  # not ready wherever listed: Triton's words
    assert failed.status is Status.NOT_FOUND
    assert failed.message == (
        "Request for unknown model: 'f' has no available versions"
        " (worker a reports UNAVAILABLE: load failed)"
    )
    assert "'nope' is not found" in healthy.no_route_error("nope").message
    down = RoutingTable(unreachable={"c": "RepositoryIndex failed: UNAVAILABLE"})
    error = down.no_route_error("nope")
    assert error.status is Status.UNAVAILABLE
    assert "not listed by any reachable worker; unreachable: c (RepositoryIndex" in error.message


def test_fill_quantum_counts_requests_from_the_max_batch_and_the_fill_factor() -> None:
    """HAProxy counts requests, not items: Q = ceil(max batch x fill factor) requests at once
    per replica (per-model factor overrides), 1 when the max batch is unknown."""
    scheduling = SchedulingConfig.model_validate(
        {"routing_fill_factor": 2.0, "models": {"m": {"fill_factor": 0.5}}}
    )
    assert fill_quantum(8, scheduling.fill_factor_of("m")) == 4
    assert fill_quantum(8, scheduling.fill_factor_of("n")) == 16
    assert fill_quantum(None, 0.3) == 1 and fill_quantum(3, 0.5) == 2
    config = GatewayConfig.model_validate(
        {"workers": ["a:1", "b:1"], "mode": "lpt_packing", "scheduling": scheduling.model_dump()}
    )
    table = RoutingTable({"m": ModelRoute(("a:1", "b:1"), max_batch=8)})
    assert plan_layout(table, config).backends[0].maxconn == 4


def test_table_swap_is_whole_and_counts_come_from_the_data_plane() -> None:
    router = Router(RoutingTable({"m": ModelRoute(("a", "b"), max_batch=4)}))
    router.swap_table(RoutingTable({"m": ModelRoute(("b", "c"), max_batch=4)}))
    assert router.table.routes["m"].replicas == ("b", "c")
    router.record_counts({("m", "b"): 5, ("m", "c"): 2}, {("m", "b"): 3, ("m", "c"): 0})
    assert router.routed() == {("m", "b"): 5, ("m", "c"): 2}
    assert router.outstanding_all() == {("m", "b"): 3}
    assert router.worker_items(["a", "b", "c"]) == {"a": 0, "b": 3, "c": 0}
