"""The gateway proxy over two real in-process gRPC workers on loopback (docs/gateway.md, "Proxy").

The workers are fake tritonservers (tritonclient's generated servicer, echoing their input and
saying who answered); the client is tritonclient's stock ``grpc.aio`` client.
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc.aio as triton_aio
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from hloserve.errors import UnavailableError
from hloserve.gateway.app import run_gateway
from hloserve.gateway.config import GatewayConfig, GrpcLimits, SchedulingConfig
from hloserve.gateway.proxy import (
    GatewayProxy,
    SingleFlight,
    Upstreams,
    channel_options,
    discover_table,
    make_server,
    poll_counters,
)
from hloserve.gateway.routing import LptPackingScheduler, RoundRobinScheduler, Router

LIMITS = GrpcLimits()


@dataclass
class FakeWorker(service_pb2_grpc.GRPCInferenceServiceServicer):
    """A worker serving ``models``; ``unavailable`` makes ModelInfer answer UNAVAILABLE."""

    name: str
    models: tuple[str, ...] = ("echo",)
    unavailable: bool = False
    deadline_exceeded: bool = False  # ModelInfer answers like a meta whose timeout ran out
    served: list[str] = field(default_factory=list)
    refuse_shm: bool = False
    regions: set[str] = field(default_factory=set)
    dies: bool = False  # ModelInfer shuts the worker's server down while holding the request
    failed: dict[str, str] = field(default_factory=dict)  # listed UNAVAILABLE: model -> reason
    server: Any = None

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        response = service_pb2.ModelStatisticsResponse()
        for m in self.models:
            row = response.model_stats.add(name=m, version="1")
            row.inference_count = row.execution_count = len(self.served)
            row.inference_stats.success.count = len(self.served)
            batch = row.batch_stats.add(batch_size=1)
            batch.compute_infer.count = len(self.served)
            batch.compute_infer.ns = 2_000_000 * len(self.served)
        return response

    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        if self.refuse_shm:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{self.name} cannot map it")
        self.regions.add(request.name)
        return service_pb2.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        if request.name not in self.regions:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no region {request.name}")
        self.regions.discard(request.name)
        return service_pb2.SystemSharedMemoryUnregisterResponse()

    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        response = service_pb2.SystemSharedMemoryStatusResponse()
        for name in sorted(self.regions):
            response.regions[name].name = name
        return response

    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        await self.SystemSharedMemoryRegister(request, context)
        return service_pb2.CudaSharedMemoryRegisterResponse()

    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        await self.SystemSharedMemoryUnregister(request, context)
        return service_pb2.CudaSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        response = service_pb2.CudaSharedMemoryStatusResponse()
        for name in sorted(self.regions):
            response.regions[name].name = name
        return response

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=not self.unavailable)

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        response = service_pb2.RepositoryIndexResponse()
        for m in self.models:
            response.models.add(name=m, version="1", state="READY")
        if not request.ready:
            for m, reason in self.failed.items():
                response.models.add(name=m, version="1", state="UNAVAILABLE", reason=reason)
        return response

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        if request.name not in self.models:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown model {request.name}")
        response = service_pb2.ModelConfigResponse()
        response.config.name = request.name
        response.config.max_batch_size = 4
        return response

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        return service_pb2.ModelMetadataResponse(name=request.name, platform=self.name)

    async def ModelStreamInfer(self, requests: Any, context: Any) -> Any:
        async for request in requests:
            self.served.append(request.id)
            response = service_pb2.ModelStreamInferResponse()
            out = response.infer_response.outputs.add(name="OUT", datatype="FP32")
            out.shape.extend(request.inputs[0].shape)
            response.infer_response.model_name = request.model_name
            response.infer_response.id = request.id
            response.infer_response.raw_output_contents.append(request.raw_input_contents[0])
            response.infer_response.parameters["worker"].string_param = self.name
            yield response

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        if self.dies:
            self.served.append(request.id)
            asyncio.get_running_loop().create_task(self.server.stop(None))
            await asyncio.sleep(30)
        if self.unavailable:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"{self.name} is down")
        if self.deadline_exceeded:  # like a meta: waits out the request's budget, then says so
            self.served.append(request.id)
            budget_us = request.parameters["timeout"].int64_param
            await asyncio.sleep(budget_us / 1e6 + 0.02)
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"model {request.model_name!r}: deadline exceeded"
            )
        if request.model_name not in self.models:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown model {request.model_name}")
        self.served.append(request.id)
        tensor = request.inputs[0]
        response = service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)
        out = response.outputs.add(name="OUT", datatype=tensor.datatype)
        out.shape.extend(tensor.shape)
        response.raw_output_contents.append(request.raw_input_contents[0])
        response.parameters["worker"].string_param = self.name
        return response


@dataclass
class Fleet:
    workers: list[FakeWorker]
    client: triton_aio.InferenceServerClient
    router: Router
    servers: list[grpc.aio.Server]


@asynccontextmanager
async def fleet(
    *workers: FakeWorker,
    scheduler: RoundRobinScheduler | LptPackingScheduler | None = None,
    first: Sequence[str] = (),
) -> AsyncIterator[Fleet]:
    """The gateway over ``workers`` (in-process), after the endpoints ``first`` (elsewhere)."""
    servers = []
    endpoints = list(first)
    for worker in workers:
        server = grpc.aio.server(options=channel_options(LIMITS))
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(worker, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        worker.server = server
        servers.append(server)
        endpoints.append(f"127.0.0.1:{port}")
    upstreams = Upstreams(endpoints, LIMITS)
    router = Router(scheduler or RoundRobinScheduler(), await discover_table(upstreams, 5.0))

    async def discover() -> None:
        router.swap_table(await discover_table(upstreams, 5.0))

    proxy = GatewayProxy(
        router,
        upstreams,
        request_timeout_s=10.0,
        probe_timeout_s=5.0,
        refresh=SingleFlight(discover, min_interval_s=0.0),
    )
    gateway, port = make_server(proxy, "127.0.0.1:0", LIMITS)
    await gateway.start()
    client = triton_aio.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        yield Fleet(list(workers), client, router, servers)
    finally:
        await client.close()
        await gateway.stop(None)
        await upstreams.close()
        for server in servers:
            await server.stop(None)


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), timeout=60))


async def _infer(client: triton_aio.InferenceServerClient, data: np.ndarray, rid: str) -> str:
    tensor = triton_aio.InferInput("IN", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    result = await client.infer("echo", [tensor], request_id=rid)
    np.testing.assert_array_equal(result.as_numpy("OUT"), data)
    worker: str = result.get_response().parameters["worker"].string_param
    return worker


def test_infer_round_robin_through_the_gateway() -> None:
    async def body() -> None:
        async with fleet(FakeWorker("w0"), FakeWorker("w1")) as f:
            data = np.arange(6, dtype=np.float32).reshape(2, 3)
            workers = [await _infer(f.client, data, f"r{i}") for i in range(4)]
            assert workers == ["w0", "w1", "w0", "w1"]
            assert f.workers[0].served == ["r0", "r2"]

    run(body)


def test_twenty_mib_tensor_round_trips() -> None:
    """Message limits are raised on the gateway server and its upstream channels."""

    async def body() -> None:
        async with fleet(FakeWorker("w0")) as f:
            data = np.random.default_rng(0).random((1, 5 * 1024 * 1024), dtype=np.float32)
            assert data.nbytes == 20 * 1024 * 1024
            assert await _infer(f.client, data, "big") == "w0"

    run(body)


def test_failover_on_unavailable() -> None:
    """UNAVAILABLE from a replica -> the request goes to another replica."""

    async def body() -> None:
        async with fleet(FakeWorker("w0", unavailable=True), FakeWorker("w1")) as f:
            data = np.ones((1, 2), np.float32)
            assert [await _infer(f.client, data, f"r{i}") for i in range(3)] == ["w1"] * 3
            assert f.router.worker_items(f.router.table.routes["echo"].replicas) == {
                w: 0 for w in f.router.table.routes["echo"].replicas
            }

    run(body)


def test_worker_dying_mid_request_is_not_resent() -> None:
    """Query-of-death protection: a worker that dies while holding a request (maybe killed by
    it) gets UNAVAILABLE for that request, and the request never reaches another replica."""

    async def body() -> None:
        w0, w1 = FakeWorker("w0", dies=True), FakeWorker("w1")
        async with fleet(w0, w1) as f:
            with pytest.raises(InferenceServerException, match="failed while it held") as info:
                await _infer(f.client, np.ones((1, 2), np.float32), "deadly")
            assert info.value.status() == "StatusCode.UNAVAILABLE"
            assert "does not send a request that may have crashed" in str(info.value)
            assert (w0.served, w1.served) == (["deadly"], [])
            replicas = f.router.table.routes["echo"].replicas
            assert f.router.worker_items(replicas) == dict.fromkeys(replicas, 0)

    run(body)


#: A worker process that lists "echo" and exits abruptly (like a segfault) on ModelInfer.
_CRASHING_WORKER = """
import asyncio, os, grpc
from tritonclient.grpc import service_pb2 as pb, service_pb2_grpc as pb_grpc

class Worker(pb_grpc.GRPCInferenceServiceServicer):
    async def RepositoryIndex(self, request, context):
        return pb.RepositoryIndexResponse(models=[dict(name="echo", version="1", state="READY")])

    async def ModelConfig(self, request, context):
        return pb.ModelConfigResponse(config=dict(name="echo", max_batch_size=4))

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    async def ModelInfer(self, request, context):
        os._exit(139)

async def main():
    server = grpc.aio.server()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(Worker(), server)
    print(server.add_insecure_port("127.0.0.1:0"), flush=True)
    await server.start()
    await server.wait_for_termination()

asyncio.run(main())
"""


def test_worker_process_crashing_on_a_request_is_not_resent() -> None:
    """A real process exiting mid-request (connection reset, no status from the worker)."""
    import subprocess
    import sys

    async def body() -> None:
        process = subprocess.Popen(
            [sys.executable, "-c", _CRASHING_WORKER], stdout=subprocess.PIPE, text=True
        )
        try:
            assert process.stdout is not None
            port = int(await asyncio.to_thread(process.stdout.readline))
            w1 = FakeWorker("w1")
            async with fleet(w1, first=[f"127.0.0.1:{port}"]) as f:
                assert f.router.table.routes["echo"].replicas[0] == f"127.0.0.1:{port}"
                with pytest.raises(InferenceServerException, match="failed while it held"):
                    await _infer(f.client, np.ones((1, 2), np.float32), "deadly")
                assert await asyncio.to_thread(process.wait, 30) == 139
                assert w1.served == []
                # the next request finds the dead worker refusing connections: it fails over
                assert await _infer(f.client, np.ones((1, 2), np.float32), "next") == "w1"
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()

    run(body)


def test_refused_connection_fails_over() -> None:
    """A worker that is down before the request is sent (connection refused): nothing was
    sent, so the request goes to the next replica."""

    async def body() -> None:
        w0, w1 = FakeWorker("w0"), FakeWorker("w1")
        async with fleet(w0, w1) as f:
            await f.servers[0].stop(None)
            data = np.ones((1, 2), np.float32)
            assert [await _infer(f.client, data, f"r{i}") for i in range(3)] == ["w1"] * 3
            assert w0.served == []

    run(body)


def test_unavailable_answers_are_resent_at_most_once() -> None:
    async def body() -> None:
        workers = [FakeWorker(f"w{i}", unavailable=i < 2) for i in range(3)]
        async with fleet(*workers) as f:
            with pytest.raises(InferenceServerException, match="no replica could serve it") as info:
                await _infer(f.client, np.ones((1, 2), np.float32), "r")
            assert info.value.status() == "StatusCode.UNAVAILABLE"
            assert "answered UNAVAILABLE: w0 is down" in str(info.value)
            assert "answered UNAVAILABLE: w1 is down" in str(info.value)
            assert workers[2].served == []

    run(body)


def test_an_expired_deadline_is_not_rerun_on_another_replica() -> None:
    """The no-re-send decision is keyed on the request's budget (KServe ``timeout``), not on
    the answer's text: the same UNAVAILABLE text without a spent budget is re-sent."""

    async def body() -> None:
        workers = [FakeWorker("w0", deadline_exceeded=True), FakeWorker("w1")]
        async with fleet(*workers) as f:
            tensor = triton_aio.InferInput("IN", [1, 2], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 2), np.float32))
            with pytest.raises(InferenceServerException, match="deadline exceeded") as info:
                await f.client.infer("echo", [tensor], request_id="r", timeout=50_000)
            assert info.value.status() == "StatusCode.UNAVAILABLE"
            assert "no replica" not in str(info.value)
            assert (workers[0].served, workers[1].served) == (["r"], [])
            # no budget: the worker's answer alone is no reason to give up on the request
            data = np.ones((1, 2), np.float32)
            assert [await _infer(f.client, data, f"s{i}") for i in range(2)] == ["w1", "w1"]
            assert len(workers[0].served) == 2 and workers[1].served == ["s0", "s1"]

    run(body)


def test_impossible_shapes_are_refused_not_forwarded() -> None:
    """0 rows or more than max_batch_size (4) rows: INVALID_ARGUMENT from the gateway."""

    async def body() -> None:
        async with fleet(FakeWorker("w0")) as f:
            for rows, match in ((0, "batch size 0"), (5, "exceeds the model's max_batch_size 4")):
                with pytest.raises(InferenceServerException, match=match) as info:
                    await _infer(f.client, np.ones((rows, 2), np.float32), "r")
                assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
                assert "model 'echo', input 'IN'" in str(info.value)
            assert f.workers[0].served == []

    run(body)


def test_model_failed_everywhere_is_unavailable_with_reasons() -> None:
    """NOT_FOUND only for a name no worker lists; a model that failed to load on every
    worker is UNAVAILABLE, with each worker's reason."""

    async def body() -> None:
        w0 = FakeWorker("w0", failed={"digits": "load failed: boom"})
        w1 = FakeWorker("w1", failed={"digits": "load failed: bang"})
        async with fleet(w0, w1) as f:
            tensor = triton_aio.InferInput("IN", [1, 2], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 2), np.float32))
            with pytest.raises(InferenceServerException) as info:
                await f.client.infer("digits", [tensor])
            assert info.value.status() == "StatusCode.UNAVAILABLE"
            message = str(info.value)
            assert "model 'digits' has no ready replica: worker 127.0.0.1:" in message
            assert "reports UNAVAILABLE: load failed: boom" in message
            assert "reports UNAVAILABLE: load failed: bang" in message
            with pytest.raises(InferenceServerException, match="not served") as info:
                await f.client.infer("nope", [tensor])
            assert info.value.status() == "StatusCode.NOT_FOUND"

    run(body)


def test_every_worker_down_is_unavailable_naming_them() -> None:
    async def body() -> None:
        async with fleet(FakeWorker("w0"), FakeWorker("w1")) as f:
            for server in f.servers:
                await server.stop(None)
            with pytest.raises(InferenceServerException) as info:
                await _infer(f.client, np.ones((1, 2), np.float32), "r")
            assert info.value.status() == "StatusCode.UNAVAILABLE"
            message = str(info.value)
            assert "model 'echo': no replica could serve it" in message
            assert message.count("unreachable (connection failed)") == 2

    run(body)


def test_unknown_model_with_an_unreachable_worker_is_unavailable() -> None:
    """A worker that never answered might serve the model: UNAVAILABLE, not NOT_FOUND."""

    async def body() -> None:
        server = grpc.aio.server()
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(FakeWorker("w0"), server)
        live = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        await server.start()
        dead = "127.0.0.1:1"  # nothing listens there
        upstreams = Upstreams((live, dead), LIMITS)
        try:
            table = await discover_table(upstreams, 5.0)
        finally:
            await upstreams.close()
            await server.stop(None)
        assert dict(table.unreachable) == {dead: "RepositoryIndex failed: UNAVAILABLE"}
        router = Router(RoundRobinScheduler(), table)
        with pytest.raises(UnavailableError, match="not listed by any reachable worker") as info:
            router.acquire("digits")
        assert dead in str(info.value)
        assert router.acquire("echo").worker == live

    run(body)


def test_no_replica_left_is_unavailable_and_unknown_model_not_found() -> None:
    async def body() -> None:
        async with fleet(FakeWorker("w0", unavailable=True)) as f:
            data = np.ones((1, 2), np.float32)
            with pytest.raises(InferenceServerException, match="no replica could serve it") as info:
                await _infer(f.client, data, "r")
            assert info.value.status() == "StatusCode.UNAVAILABLE"
            tensor = triton_aio.InferInput("IN", [1, 2], "FP32")
            tensor.set_data_from_numpy(data)
            with pytest.raises(InferenceServerException, match="not served") as info:
                await f.client.infer("nope", [tensor])
            assert info.value.status() == "StatusCode.NOT_FOUND"

    run(body)


def test_other_upstream_errors_pass_through() -> None:
    async def body() -> None:
        worker = FakeWorker("w0")
        async with fleet(worker) as f:
            worker.models = ()  # unloaded after discovery: the worker says NOT_FOUND
            with pytest.raises(InferenceServerException, match="unknown model echo") as info:
                await _infer(f.client, np.ones((1, 2), np.float32), "r")
            assert info.value.status() == "StatusCode.NOT_FOUND"

    run(body)


def test_lpt_packing_reads_the_batch_extent() -> None:
    """The quantum (max batch 4 from ModelConfig) is counted in items."""

    async def body() -> None:
        scheduler = LptPackingScheduler(SchedulingConfig(routing_policy="fill_rr"))
        async with fleet(FakeWorker("w0"), FakeWorker("w1"), scheduler=scheduler) as f:
            assert f.router.table.routes["echo"].max_batch == 4
            lease = f.router.acquire("echo", 3)  # w0 run holds 3 of 4 items
            worker = await _infer(f.client, np.ones((2, 2), np.float32), "r")
            f.router.release(lease)
            assert worker == "w0"  # 3 + 2 >= 4: the run closes after this request
            assert await _infer(f.client, np.ones((1, 2), np.float32), "s") == "w1"

    run(body)


def test_server_and_model_rpcs() -> None:
    async def body() -> None:
        async with fleet(FakeWorker("w0", models=("a", "echo")), FakeWorker("w1")) as f:
            assert await f.client.is_server_live()
            assert await f.client.is_server_ready()
            metadata = await f.client.get_model_metadata("a")
            assert metadata.platform == "w0"  # only w0 serves "a"
            config = await f.client.get_model_config("echo")
            assert config.config.max_batch_size == 4
            index = await f.client.get_model_repository_index()
            assert [(m.name, m.state) for m in index.models] == [("a", "READY"), ("echo", "READY")]
            with pytest.raises(InferenceServerException) as info:
                await f.client.get_server_metadata()
            assert info.value.status() == "StatusCode.UNIMPLEMENTED"

    run(body)


def test_not_ready_fleet() -> None:
    async def body() -> None:
        async with fleet(FakeWorker("w0", unavailable=True)) as f:
            assert not await f.client.is_server_ready()

    run(body)


async def _http(port: int, path: str) -> tuple[int, str]:
    def get() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    return await asyncio.to_thread(get)


def test_run_gateway_discovers_models_loaded_later() -> None:
    """Discovery polls the workers and swaps the table; the admin port tells."""

    async def body() -> None:
        worker = FakeWorker("w0", models=())
        server = grpc.aio.server(options=channel_options(LIMITS))
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(worker, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        config = GatewayConfig.model_validate(
            {"workers": [f"127.0.0.1:{port}"], "discovery": {"poll_interval_seconds": 0.1}}
        )
        stop = asyncio.Event()
        task, port, admin = await _start_gateway(config, stop)
        client = triton_aio.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            assert await _http(admin, "/healthz") == (200, "ok\n")
            assert await _http(admin, "/readyz") == (503, "not ready\n")
            assert (await _http(admin, "/nope"))[0] == 404
            with pytest.raises(InferenceServerException, match="not served"):
                await _infer(client, np.ones((1, 2), np.float32), "early")
            worker.models = ("echo",)
            for _ in range(100):
                await asyncio.sleep(0.05)
                try:
                    assert await _infer(client, np.ones((1, 2), np.float32), "late") == "w0"
                    break
                except InferenceServerException:
                    continue
            assert worker.served == ["late"]
            assert await _http(admin, "/readyz") == (200, "ready\n")
            status, text = await _http(admin, "/metrics")
            assert status == 200
            ok = 'hloserve_gateway_requests_total{model="echo",outcome="ok",worker="127.0.0.1:'
            assert ok in text
            assert 'hloserve_gateway_replicas{model="echo"} 1.0' in text
            assert "hloserve_gateway_upstream_seconds_bucket" in text
            assert "hloserve_gateway_table_swaps_total" in text
        finally:
            await client.close()
            stop.set()
            await task
            await server.stop(None)

    run(body)


def test_cli_gateway_reports_a_bad_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hloserve.cli import main

    path = tmp_path / "gateway.yaml"
    path.write_text("workers: []\n")
    assert main(["gateway", "--config", str(path)]) == 1
    assert "error (INVALID_ARGUMENT): gateway config" in capsys.readouterr().err


def test_model_statistics_are_summed_over_workers() -> None:
    async def body() -> None:
        async with fleet(FakeWorker("w0"), FakeWorker("w1")) as f:
            for i in range(4):
                await _infer(f.client, np.ones((1, 2), np.float32), f"r{i}")
            stats = await f.client.get_inference_statistics("echo")
            row = stats.model_stats[0]
            assert row.inference_count == 4 == row.inference_stats.success.count

    run(body)


@pytest.mark.parametrize("kind", ["system", "cuda"])
def test_shm_register_fans_out_and_rolls_back(kind: str) -> None:
    """Register on every worker or on none; unregister succeeds if any worker does; status is
    the first worker's. CUDA regions follow the same rules as system ones."""

    async def body() -> None:
        w0, w1 = FakeWorker("w0"), FakeWorker("w1")
        async with fleet(w0, w1) as f:
            client = f.client

            async def register(name: str) -> None:
                if kind == "system":
                    await client.register_system_shared_memory(name, f"/{name}", 64)
                else:
                    await client.register_cuda_shared_memory(name, bytes(64), 0, 64)

            unregister = getattr(client, f"unregister_{kind}_shared_memory")
            await register("region")
            assert w0.regions == w1.regions == {"region"}
            status = await getattr(client, f"get_{kind}_shared_memory_status")()
            assert list(status.regions) == ["region"]
            w1.regions.clear()
            await unregister("region")  # w0 succeeds
            assert w0.regions == set()
            with pytest.raises(InferenceServerException, match="no region region"):
                await unregister("region")  # no worker succeeds: the first error
            w1.refuse_shm = True
            with pytest.raises(InferenceServerException, match="w1 cannot map it") as info:
                await register("other")
            assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
            assert w0.regions == set()  # rolled back

    run(body)


def test_stream_messages_are_shape_checked_and_admitted_by_items() -> None:
    """A stream's first request is charged its batch extent; a message no model can run ends
    the stream with INVALID_ARGUMENT and never reaches the worker."""

    async def body() -> None:
        w0 = FakeWorker("w0")  # max_batch_size 4
        async with fleet(w0) as f:

            async def requests(rows: list[int]) -> AsyncIterator[dict[str, Any]]:
                for i, n in enumerate(rows):
                    tensor = triton_aio.InferInput("IN", [n, 2], "FP32")
                    tensor.set_data_from_numpy(np.ones((n, 2), np.float32))
                    yield {"model_name": "echo", "inputs": [tensor], "request_id": f"s{i}"}

            seen = []
            with pytest.raises(grpc.aio.AioRpcError) as info:  # the stream ends with it
                async for result, error in f.client.stream_infer(requests([2, 0, 1])):
                    assert error is None
                    seen.append(result.get_response().id)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "batch size 0" in (info.value.details() or "")
            assert w0.served == ["s0"] and seen == ["s0"]  # s1 and s2 never forwarded
            replicas = f.router.table.routes["echo"].replicas
            assert f.router.worker_items(replicas) == dict.fromkeys(replicas, 0)

    run(body)


def test_stream_infer_passes_through_to_one_replica() -> None:
    async def body() -> None:
        w0, w1 = FakeWorker("w0"), FakeWorker("w1")
        async with fleet(w0, w1) as f:
            data = np.arange(4, dtype=np.float32).reshape(1, 4)

            async def requests() -> AsyncIterator[dict[str, Any]]:
                for i in range(3):
                    tensor = triton_aio.InferInput("IN", [1, 4], "FP32")
                    tensor.set_data_from_numpy(data * i)
                    yield {"model_name": "echo", "inputs": [tensor], "request_id": f"s{i}"}

            seen = []
            async for result, error in f.client.stream_infer(requests()):
                assert error is None
                seen.append(result.get_response().id)
                i = int(seen[-1][1:])
                np.testing.assert_array_equal(result.as_numpy("OUT"), data * i)
            assert seen == ["s0", "s1", "s2"]
            assert (w0.served, w1.served) == (["s0", "s1", "s2"], [])
            replicas = f.router.table.routes["echo"].replicas
            assert f.router.worker_items(replicas) == dict.fromkeys(replicas, 0)

    run(body)


def test_unknown_model_triggers_a_refresh() -> None:
    """A model loaded after the last poll is served on its first request."""

    async def body() -> None:
        worker = FakeWorker("w0", models=())
        async with fleet(worker) as f:
            assert "echo" not in f.router.table.routes
            worker.models = ("echo",)
            assert await _infer(f.client, np.ones((1, 2), np.float32), "r") == "w0"

    run(body)


def test_single_flight_runs_once_for_concurrent_callers() -> None:
    async def body() -> None:
        calls = 0

        async def refresh() -> None:
            nonlocal calls
            calls += 1
            await asyncio.sleep(0.05)

        flight = SingleFlight(refresh, min_interval_s=30.0)
        await asyncio.gather(*(flight() for _ in range(5)))
        assert calls == 1
        await flight()  # within the interval
        assert calls == 1
        eager = SingleFlight(refresh, min_interval_s=0.0)
        await eager()
        await eager()
        assert calls == 3

        async def broken() -> None:
            raise OSError("down")

        failing = SingleFlight(broken, min_interval_s=30.0)
        with pytest.raises(OSError, match="down"):
            await failing()
        await failing()  # a failed refresh also counts against the interval
        assert failing.count == 0

    run(body)


def test_lpt_packing_gateway_places_each_model_on_one_worker() -> None:
    """Rows 69, 72: default replicas 1: every request of the model goes to its one worker."""

    async def body() -> None:
        workers = [FakeWorker("w0"), FakeWorker("w1")]
        servers, endpoints = [], []
        for worker in workers:
            server = grpc.aio.server(options=channel_options(LIMITS))
            service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(worker, server)
            endpoints.append(f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}")
            await server.start()
            servers.append(server)
        config = GatewayConfig.model_validate({"workers": endpoints, "mode": "lpt_packing"})
        stop = asyncio.Event()
        task, port, admin = await _start_gateway(config, stop)
        client = triton_aio.InferenceServerClient(f"127.0.0.1:{port}")
        upstreams = Upstreams(endpoints, LIMITS)
        try:
            answered = {
                await _infer(client, np.ones((1, 2), np.float32), f"r{i}") for i in range(4)
            }
            assert len(answered) == 1
            counters = await poll_counters(upstreams, 5.0)
            served_on = endpoints[0] if answered == {"w0"} else endpoints[1]
            assert counters[("echo", served_on)].items == 4
            assert counters[("echo", served_on)].compute_seconds == pytest.approx(0.008)
            _, text = await _http(admin, "/metrics")
            assert "hloserve_gateway_repacks_total 1.0" in text
        finally:
            await client.close()
            await upstreams.close()
            stop.set()
            await task
            for server in servers:
                await server.stop(None)

    run(body)


def test_cli_gateway_serves_until_sigterm() -> None:
    """`hloserve gateway` with env-only settings: live, not ready (no worker), exits 0 on TERM."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import tritonclient.grpc as triton_grpc

    from hloserve.node.tritonserver import free_ports

    grpc_port, admin_port, dead_port = free_ports(3)
    env = dict(
        os.environ,
        HLOSERVE_GATEWAY_WORKERS=f"127.0.0.1:{dead_port}",
        HLOSERVE_GATEWAY_LISTEN=f"127.0.0.1:{grpc_port}",
        HLOSERVE_GATEWAY_ADMIN_PORT=str(admin_port),
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "hloserve.cli", "gateway"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        client = triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        deadline = time.monotonic() + 30
        while True:
            try:
                assert client.is_server_live()
                break
            except InferenceServerException:
                assert time.monotonic() < deadline, "gateway did not start"
                assert process.poll() is None, process.stderr.read() if process.stderr else ""
                time.sleep(0.2)
        assert not client.is_server_ready()
        client.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()


def test_worker_not_found_fails_over_and_refreshes() -> None:
    """A replica that lost the model answers NOT_FOUND; the request moves on and the table is
    refreshed in the background."""

    async def body() -> None:
        w0, w1 = FakeWorker("w0"), FakeWorker("w1")
        async with fleet(w0, w1) as f:
            assert len(f.router.table.routes["echo"].replicas) == 2
            w0.models = ()
            data = np.ones((1, 2), np.float32)
            assert [await _infer(f.client, data, f"r{i}") for i in range(4)] == ["w1"] * 4
            for _ in range(100):
                if len(f.router.table.routes["echo"].replicas) == 1:
                    break
                await asyncio.sleep(0.02)
            assert len(f.router.table.routes["echo"].replicas) == 1

    run(body)


async def _start_gateway(
    config: GatewayConfig, stop: asyncio.Event
) -> tuple[asyncio.Task[None], int, int]:
    """run_gateway on free loopback ports; (its task, gRPC port, admin port) once it listens."""
    ready: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        run_gateway(
            config,
            stop,
            listen="127.0.0.1:0",
            admin_port=0,
            on_ready=lambda port, admin: ready.set_result((port, admin)),
        )
    )
    port, admin = await ready
    return task, port, admin


def test_a_taken_grpc_or_admin_port_is_unavailable_before_discovery() -> None:
    """A second gateway on a taken port must fail, not share it (gRPC's SO_REUSEPORT is off)."""

    async def body() -> None:
        server = grpc.aio.server(options=channel_options(LIMITS))
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(FakeWorker("w0"), server)
        worker_port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        config = GatewayConfig(workers=(f"127.0.0.1:{worker_port}",))
        stop = asyncio.Event()
        task, port, admin = await _start_gateway(config, stop)
        try:
            for listen, admin_port, what in (
                (f"127.0.0.1:{port}", 0, "cannot listen on 127.0.0.1:"),
                ("127.0.0.1:0", admin, "cannot serve the admin port 127.0.0.1:"),
            ):
                second = run_gateway(config, asyncio.Event(), listen=listen, admin_port=admin_port)
                with pytest.raises(UnavailableError, match=what):
                    await asyncio.wait_for(second, 10)
        finally:
            stop.set()
            await task
            await server.stop(None)

    run(body)
