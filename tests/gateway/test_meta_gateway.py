"""The gateway routes a meta model only to workers that serve its whole group.

Fake workers (real gRPC on loopback); ``cascade`` is a meta (backend ``hloserve_meta`` with
``hloserve.meta_calls``) calling ``fast`` and ``strong``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("tritonclient.grpc")

from hloserve import names
from hloserve.gateway.discovery import discover_table
from hloserve.gateway.routing import RoutingTable
from hloserve.gateway.upstreams import Upstreams
from tests.gateway.test_proxy import LIMITS, FakeWorker, gateway, run


@dataclass
class MetaWorker(FakeWorker):
    """A fake worker whose ``cascade`` is a meta calling ``fast`` and ``strong``."""

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        response = await super().ModelConfig(request, context)
        if request.name == "cascade":
            response.config.backend = names.META_BACKEND
            response.config.max_batch_size = 0
            response.config.parameters[names.PARAM_META_CALLS].string_value = "fast,strong"
        return response


async def _discovered(endpoints: list[str]) -> RoutingTable:
    upstreams = Upstreams(endpoints, LIMITS)
    try:
        return await discover_table(upstreams, 5.0)
    finally:
        await upstreams.close()


def test_meta_is_routed_only_to_workers_with_its_whole_group() -> None:
    async def body() -> None:
        async with gateway(
            MetaWorker("w0", ("cascade", "fast")),  # lacks strong
            MetaWorker("w1", ("cascade", "fast", "strong")),
            MetaWorker("w2", ("cascade", "fast", "strong")),
        ) as g:
            table = await _discovered(g.endpoints)
            _, w1, w2 = table.get("fast").replicas  # plain models keep every replica
            assert table.get("cascade").replicas == (w1, w2)
            assert table.get("cascade").max_batch is None
            for _ in range(4):  # HAProxy's backend for cascade holds w1 and w2 only
                answer = await g.client.infer("cascade", [_input()])
                assert answer.get_response().parameters["worker"].string_param in ("w1", "w2")

    run(body)


def test_meta_without_a_whole_group_anywhere_keeps_its_replicas() -> None:
    async def body() -> None:
        async with gateway(MetaWorker("w0", ("cascade", "fast"))) as g:
            assert len((await _discovered(g.endpoints)).get("cascade").replicas) == 1
            answer = await g.client.infer("cascade", [_input()])
            assert answer.get_response().parameters["worker"].string_param == "w0"

    run(body)


def _input() -> Any:
    import numpy as np
    import tritonclient.grpc.aio as triton_aio

    tensor = triton_aio.InferInput("IN", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 2), np.float32))
    return tensor


def test_lpt_packing_places_a_meta_with_its_group_footprint_and_callees() -> None:
    from hloserve.gateway.config import SchedulingConfig
    from hloserve.gateway.packing import Counters, LptController, WeightInfo
    from hloserve.gateway.routing import ModelRoute, RoutingTable

    workers = ("w0", "w1", "w2")
    discovered = RoutingTable(
        {
            "fast": ModelRoute(workers, max_batch=32),
            "strong": ModelRoute(workers, max_batch=32),
            "other": ModelRoute(workers, max_batch=8),
            "cascade": ModelRoute(workers, calls=("fast", "strong")),
        }
    )
    weights = WeightInfo(model_bytes={"fast": 10, "strong": 1000, "other": 500})
    controller = LptController(SchedulingConfig())
    table = controller.tick(discovered, {}, 1.0, weights)
    (home,) = table.get("cascade").replicas
    assert home in table.get("fast").replicas and home in table.get("strong").replicas
    assert table.get("cascade").calls == ("fast", "strong")
    assert controller.placement is not None
    assert controller.placement.weight_bytes[home] >= 1010  # the group's footprint
    # a meta's time is its sub-calls': it does not count toward the fleet's compute
    counters = {("cascade", home): Counters(10, 5.0), ("fast", home): Counters(10, 0.5)}
    controller.observe(counters, 1.0)
    assert controller.observe(
        {k: Counters(v.items * 2, v.compute_seconds * 2) for k, v in counters.items()}, 1.0
    ) == pytest.approx(0.5)
    assert "cascade" not in controller.estimates()
