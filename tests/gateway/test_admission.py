"""Worker health probes of the gateway (docs/gateway.md, "Health probes"); the admission
bound is HAProxy's (tests/gateway/test_haproxy.py).

Pure logic first (HealthTracker, restrict_to_healthy), then the whole gateway (run_gateway)
over fake gRPC workers on loopback: a worker failing its ServerReady probes leaves the table
(its only model answers UNAVAILABLE, not NOT_FOUND) and returns when ready again.
"""

from __future__ import annotations

import asyncio
import urllib.request
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc.aio as triton_aio
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from hloserve.gateway.config import GatewayConfig
from hloserve.gateway.discovery import discover_table
from hloserve.gateway.routing import HealthTracker, ModelRoute, RoutingTable, restrict_to_healthy
from hloserve.gateway.upstreams import Upstreams, channel_options
from tests.gateway.test_proxy import LIMITS, FakeWorker, _start_gateway


def test_health_tracker_needs_consecutive_failures_and_one_success() -> None:
    health = HealthTracker(["a", "b"], failure_threshold=2)
    assert not health.record("a", False)  # one failure: still healthy
    assert not health.record("a", True)  # the count starts again
    assert not health.record("a", False)
    assert health.record("a", False)  # second in a row: out
    assert health.unhealthy == {"a"} and not health.is_healthy("a")
    assert not health.record("a", False)  # no change
    assert health.record("a", True)  # back after one success
    assert health.unhealthy == frozenset()
    with pytest.raises(ValueError):
        HealthTracker(["a"], failure_threshold=0)


def test_restrict_keeps_models_without_a_healthy_replica() -> None:
    table = RoutingTable(
        {"two": ModelRoute(("a", "b"), max_batch=8), "one": ModelRoute(("b",), max_batch=4)}
    )
    restricted = restrict_to_healthy(table, frozenset({"b"}))
    assert restricted.routes["two"] == ModelRoute(("a",), max_batch=8)
    assert restricted.routes["one"].replicas == ()
    assert restrict_to_healthy(table, frozenset()) is table


@dataclass
class SlowWorker(FakeWorker):
    """ModelInfer counts its arrival, then waits until ``release`` is set."""

    release: asyncio.Event | None = None
    arrived: int = 0

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        assert self.release is not None
        self.arrived += 1
        await self.release.wait()
        return await super().ModelInfer(request, context)


async def _serve(worker: FakeWorker) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server(options=channel_options(LIMITS))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(worker, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def _scrape(admin_port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics", timeout=10) as reply:
        text: str = reply.read().decode()
    return text


def _input(rows: int) -> triton_aio.InferInput:
    tensor = triton_aio.InferInput("IN", [rows, 3], "FP32")
    tensor.set_data_from_numpy(np.ones((rows, 3), np.float32))
    return tensor


def test_a_worker_failing_probes_leaves_the_table_and_returns() -> None:
    async def body() -> None:
        w0, w1 = FakeWorker("w0", models=("echo",)), FakeWorker("w1", models=("echo", "solo"))
        s0, e0 = await _serve(w0)
        s1, e1 = await _serve(w1)
        config = GatewayConfig(
            workers=(e0, e1),
            health={"interval_seconds": 0.05, "failure_threshold": 2},
            discovery={"poll_interval_seconds": 60},
        )
        stop = asyncio.Event()
        task, port, admin = await _start_gateway(config, stop)
        client = triton_aio.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            assert (await client.infer("solo", [_input(1)])).as_numpy("OUT").shape == (1, 3)
            w1.unavailable = True  # ServerReady false, ModelInfer UNAVAILABLE
            message = ""
            for _ in range(200):  # until the probes took it out (bounded: 10 s)
                with pytest.raises(InferenceServerException) as unavailable:
                    await client.infer("solo", [_input(1)])
                assert unavailable.value.status() == "StatusCode.UNAVAILABLE"
                message = str(unavailable.value)
                if "health probes" in message:  # the router's answer: w1 left the table
                    break
                await asyncio.sleep(0.05)
            assert (
                f"model 'solo' has no ready replica: worker {e1} unreachable (failed its" in message
            )
            metrics = await asyncio.to_thread(_scrape, admin)
            assert f'hloserve_gateway_worker_healthy{{worker="{e1}"}} 0.0' in metrics
            assert f'hloserve_gateway_worker_healthy{{worker="{e0}"}} 1.0' in metrics
            before = len(w0.served)
            for _ in range(4):  # every echo is served by w0
                await client.infer("echo", [_input(1)])
            assert len(w0.served) == before + 4

            w1.unavailable = False
            for _ in range(200):  # until the probes bring it back (bounded: 10 s)
                try:
                    await client.infer("solo", [_input(1)])
                    break
                except InferenceServerException:
                    await asyncio.sleep(0.05)
            assert (await client.infer("solo", [_input(1)])).as_numpy("OUT").shape == (1, 3)
        finally:
            await client.close()
            stop.set()
            await task
            await s0.stop(None)
            await s1.stop(None)

    asyncio.run(asyncio.wait_for(body(), timeout=60))


def test_discovery_keeps_the_models_of_a_worker_that_does_not_answer() -> None:
    async def body() -> None:
        worker = FakeWorker("w0", models=("echo",))
        server, endpoint = await _serve(worker)
        dead = "127.0.0.1:1"  # nothing listens there
        upstreams = Upstreams((endpoint, dead), LIMITS)
        try:
            previous = RoutingTable({"solo": ModelRoute((dead,), max_batch=2)})
            table = await discover_table(upstreams, 2.0, previous)
            assert table.routes["solo"] == ModelRoute((dead,), max_batch=2)
            assert table.routes["echo"].replicas == (endpoint,)
            assert "solo" not in (await discover_table(upstreams, 2.0)).routes
        finally:
            await upstreams.close()
            await server.stop(None)

    asyncio.run(asyncio.wait_for(body(), timeout=60))
