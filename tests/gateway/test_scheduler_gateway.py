"""lpt_packing refuses workers that schedule fair (docs/scheduling.md, "The gateway's lpt_packing").

In-process fake workers over real gRPC on loopback; their ``hloserve_runtime`` config carries
the discipline as the repository generator writes it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("tritonclient.grpc")  # absent from the numpy-2 leg (grpc comes with it)

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from hloserve import names
from hloserve.errors import Status, WorkerSchedulingError
from hloserve.gateway.app import run_gateway
from hloserve.gateway.config import GatewayConfig
from hloserve.gateway.proxy import Upstreams, channel_options
from hloserve.gateway.upstreams import check_lpt_workers
from tests.gateway.test_proxy import LIMITS, FakeWorker, run


@dataclass
class HloserveWorker(FakeWorker):
    """A fake worker with an ``hloserve_runtime`` whose config says ``scheduling``."""

    scheduling: str | None = None  # None: the parameter is absent (a default build: fair)

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        if request.name != names.RUNTIME_MODEL:
            return await super().ModelConfig(request, context)
        response = service_pb2.ModelConfigResponse()
        response.config.name = names.RUNTIME_MODEL
        response.config.backend = names.RUNTIME_BACKEND
        if self.scheduling is not None:
            response.config.parameters[names.PARAM_SCHEDULING].string_value = self.scheduling
        return response


async def _serve(workers: list[FakeWorker]) -> tuple[list[Any], list[str]]:
    servers, endpoints = [], []
    for worker in workers:
        server = grpc.aio.server(options=channel_options(LIMITS))
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(worker, server)
        endpoints.append(f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}")
        await server.start()
        servers.append(server)
    return servers, endpoints


def test_check_names_every_fair_worker_and_accepts_fifo_edf_and_unknown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def body() -> None:
        workers = [
            HloserveWorker("fifo", scheduling="fifo"),
            HloserveWorker("edf", scheduling="edf"),
            FakeWorker("plain"),  # no hloserve runtime: unknown, warned about
            HloserveWorker("default"),  # built without --scheduling: fair
            HloserveWorker("fair", scheduling="fair"),
        ]
        servers, endpoints = await _serve(workers)
        upstreams = Upstreams(endpoints, LIMITS)
        try:
            with pytest.raises(WorkerSchedulingError) as info:
                await check_lpt_workers(upstreams, 5.0)
            assert info.value.status is Status.FAILED_PRECONDITION
            message = str(info.value)
            assert f"{endpoints[3]} (fair)" in message and f"{endpoints[4]} (fair)" in message
            assert endpoints[0] not in message and endpoints[2] not in message
            assert "--scheduling fifo" in message
            assert f"worker {endpoints[2]} serves no hloserve runtime" in caplog.text
            ok = Upstreams(endpoints[:3], LIMITS)
            try:
                await check_lpt_workers(ok, 5.0)
            finally:
                await ok.close()
        finally:
            await upstreams.close()
            for server in servers:
                await server.stop(None)

    with caplog.at_level(logging.WARNING, "hloserve.gateway"):
        run(body)


@pytest.mark.parametrize(("mode", "refused"), [("lpt_packing", True), ("round_robin", False)])
def test_an_lpt_packing_gateway_refuses_to_start_over_a_fair_worker(
    mode: str, refused: bool
) -> None:
    async def body() -> None:
        servers, endpoints = await _serve([HloserveWorker("w0", scheduling="fair")])
        config = GatewayConfig.model_validate({"workers": endpoints, "mode": mode})
        stop = asyncio.Event()
        ready = asyncio.Event()
        task = asyncio.ensure_future(
            run_gateway(
                config, stop, listen="127.0.0.1:0", admin_port=0, on_ready=lambda *_: ready.set()
            )
        )
        try:
            done, _ = await asyncio.wait(
                [task, asyncio.ensure_future(ready.wait())],
                timeout=20,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if refused:
                assert task in done
                with pytest.raises(WorkerSchedulingError, match="lpt_packing needs workers"):
                    task.result()
            else:
                assert ready.is_set() and task not in done
        finally:
            stop.set()
            if not task.done():
                await task
            for server in servers:
                await server.stop(None)

    run(body)
