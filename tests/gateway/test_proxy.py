"""The gateway (HAProxy and the Python servicer behind it, ``run_gateway``) over real
in-process gRPC workers on loopback (docs/gateway.md, "Proxy").

The workers are fake tritonservers (tritonclient's generated servicer, echoing their input and
saying who answered); the client is tritonclient's stock ``grpc.aio`` client. The HAProxy data
plane's own rules are in tests/gateway/test_haproxy.py.
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
from hloserve.gateway.config import GatewayConfig, GrpcLimits
from hloserve.gateway.discovery import SingleFlight, discover_table
from hloserve.gateway.upstreams import Upstreams, channel_options, poll_counters

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
class Gateway:
    workers: list[FakeWorker]
    servers: list[grpc.aio.Server]
    endpoints: list[str]
    client: triton_aio.InferenceServerClient
    port: int
    admin: int


@asynccontextmanager
async def gateway(
    *workers: FakeWorker, first: Sequence[str] = (), **settings: Any
) -> AsyncIterator[Gateway]:
    """run_gateway (HAProxy and the Python servicer) over ``workers`` (in-process), after the
    endpoints ``first`` (elsewhere); health probes every 60 s and discovery every 60 s unless
    set."""
    servers, endpoints = [], list(first)
    for worker in workers:
        server = grpc.aio.server(options=channel_options(LIMITS))
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(worker, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        worker.server = server
        servers.append(server)
        endpoints.append(f"127.0.0.1:{port}")
    data = {
        "workers": endpoints,
        "health": {"interval_seconds": 60.0},
        "discovery": {"poll_interval_seconds": 60.0},
        **settings,
    }
    config = GatewayConfig.model_validate(data)
    stop = asyncio.Event()
    task, port, admin = await _start_gateway(config, stop)
    client = triton_aio.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        yield Gateway(list(workers), servers, endpoints, client, port, admin)
    finally:
        await client.close()
        stop.set()
        await task
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
            async with gateway(w1, first=[f"127.0.0.1:{port}"]) as g:
                data = np.ones((1, 2), np.float32)
                with pytest.raises(InferenceServerException) as info:
                    for i in range(2):  # round robin: one of the two reaches the process
                        await _infer(g.client, data, f"deadly{i}")
                assert info.value.status() == "StatusCode.UNAVAILABLE", str(info.value)
                assert await asyncio.to_thread(process.wait, 30) == 139
                deadly = f"deadly{len(w1.served)}"  # the request the process held
                assert deadly not in w1.served, (str(info.value), w1.served)
                # the next request finds the dead worker refusing connections: it fails over
                assert await _infer(g.client, np.ones((1, 2), np.float32), "next") == "w1"
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()

    run(body)


def test_a_workers_unavailable_answer_is_relayed_not_resent() -> None:
    """HAProxy re-sends a request only when no connection was made: a live worker's
    UNAVAILABLE answer (the model not ready there, a meta's spent budget) reaches the client
    as the worker gave it, and no other replica runs the request."""

    async def body() -> None:
        workers = [FakeWorker("w0", unavailable=True), FakeWorker("w1")]
        async with gateway(*workers) as g:
            data = np.ones((1, 2), np.float32)
            answers = []
            for i in range(2):  # round robin: one to each worker
                try:
                    answers.append(await _infer(g.client, data, f"r{i}"))
                except InferenceServerException as exc:
                    assert exc.status() == "StatusCode.UNAVAILABLE"
                    assert "w0 is down" in str(exc)
                    answers.append("refused")
            assert sorted(answers) == ["refused", "w1"]
            assert len(workers[1].served) == 1

    run(body)


def test_impossible_shapes_are_refused_not_forwarded() -> None:
    """BYTES first input (the Python path's shape check; other requests' shapes are Triton's
    to check): 0 rows or more than max_batch_size (4) rows: INVALID_ARGUMENT from the
    gateway, never forwarded."""

    async def body() -> None:
        async with gateway(FakeWorker("w0")) as g:
            for rows, match in ((0, "batch size 0"), (5, "exceeds the model's max_batch_size 4")):
                tensor = triton_aio.InferInput("IN", [rows, 1], "BYTES")
                tensor.set_data_from_numpy(np.full((rows, 1), b"x", np.object_))
                with pytest.raises(InferenceServerException, match=match) as info:
                    await g.client.infer("echo", [tensor])
                assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
                assert "model 'echo', input 'IN'" in str(info.value)
            assert g.workers[0].served == []

    run(body)


def test_model_failed_everywhere_is_not_found_in_tritons_words_with_reasons() -> None:
    """A model that failed to load on every worker gets what one tritonserver answers for it
    (NOT_FOUND "... has no available versions"), then each worker's reason."""

    async def body() -> None:
        w0 = FakeWorker("w0", failed={"digits": "load failed: boom"})
        w1 = FakeWorker("w1", failed={"digits": "load failed: bang"})
        async with gateway(w0, w1) as g:
            tensor = triton_aio.InferInput("IN", [1, 2], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 2), np.float32))
            with pytest.raises(InferenceServerException) as info:
                await g.client.infer("digits", [tensor])
            assert info.value.status() == "StatusCode.NOT_FOUND"  # as one tritonserver answers
            message = str(info.value)
            assert "Request for unknown model: 'digits' has no available versions" in message
            assert "reports UNAVAILABLE: load failed: boom" in message
            assert "reports UNAVAILABLE: load failed: bang" in message
            with pytest.raises(InferenceServerException, match="is not found") as info:
                await g.client.infer("nope", [tensor])
            assert info.value.status() == "StatusCode.NOT_FOUND"

    run(body)


def test_every_worker_down_is_unavailable_naming_them() -> None:
    async def body() -> None:
        async with gateway(FakeWorker("w0"), FakeWorker("w1")) as g:
            for server in g.servers:
                await server.stop(None)
            with pytest.raises(InferenceServerException) as info:
                await _infer(g.client, np.ones((1, 2), np.float32), "r")
            assert info.value.status() == "StatusCode.UNAVAILABLE"
            assert "model 'echo': no replica could take the request" in str(info.value)

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
        error = table.no_route_error("digits")
        assert isinstance(error, UnavailableError)
        assert "not listed by any reachable worker" in str(error) and dead in str(error)
        assert table.routes["echo"].replicas == (live,)

    run(body)


def test_other_upstream_errors_pass_through() -> None:
    async def body() -> None:
        worker = FakeWorker("w0")
        async with gateway(worker) as g:
            worker.models = ()  # unloaded after discovery: the worker says NOT_FOUND
            with pytest.raises(InferenceServerException, match="unknown model echo") as info:
                await _infer(g.client, np.ones((1, 2), np.float32), "r")
            assert info.value.status() == "StatusCode.NOT_FOUND"

    run(body)


def test_server_and_model_rpcs() -> None:
    async def body() -> None:
        async with gateway(FakeWorker("w0", models=("a", "echo")), FakeWorker("w1")) as g:
            assert await g.client.is_server_live()
            assert await g.client.is_server_ready()
            metadata = await g.client.get_model_metadata("a")
            assert metadata.platform == "w0"  # only w0 serves "a"
            config = await g.client.get_model_config("echo")
            assert config.config.max_batch_size == 4
            index = await g.client.get_model_repository_index()
            assert [(m.name, m.state) for m in index.models] == [("a", "READY"), ("echo", "READY")]
            with pytest.raises(InferenceServerException) as info:
                await g.client.get_server_metadata()
            assert info.value.status() == "StatusCode.UNIMPLEMENTED"

    run(body)


def test_not_ready_fleet() -> None:
    async def body() -> None:
        async with gateway(FakeWorker("w0", unavailable=True)) as g:
            assert not await g.client.is_server_ready()

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
            with pytest.raises(InferenceServerException, match="is not found"):
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
            assert 'haproxy_server_sessions_total{proxy="m_echo",server="w0"} 1' in text
            assert 'hloserve_gateway_replicas{model="echo"} 1.0' in text
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
        async with gateway(FakeWorker("w0"), FakeWorker("w1")) as g:
            for i in range(4):
                await _infer(g.client, np.ones((1, 2), np.float32), f"r{i}")
            stats = await g.client.get_inference_statistics("echo")
            row = stats.model_stats[0]
            assert row.inference_count == 4 == row.inference_stats.success.count

    run(body)


@pytest.mark.parametrize("kind", ["system", "cuda"])
def test_shm_register_fans_out_and_rolls_back(kind: str) -> None:
    """Register on every worker or on none; unregister succeeds if any worker does; status is
    the first worker's. CUDA regions follow the same rules as system ones."""

    async def body() -> None:
        w0, w1 = FakeWorker("w0"), FakeWorker("w1")
        async with gateway(w0, w1) as g:
            client = g.client

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


def test_unknown_model_triggers_a_refresh() -> None:
    """A model loaded after the last poll is served on its first request."""

    async def body() -> None:
        worker = FakeWorker("w0", models=())
        async with gateway(worker) as g:
            worker.models = ("echo",)
            await asyncio.sleep(1.1)  # unknown names start a discovery pass at most once a second
            assert await _infer(g.client, np.ones((1, 2), np.float32), "r") == "w0"

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

    from hloserve.ports import free_ports

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
