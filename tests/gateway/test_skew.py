"""lpt_packing under a skewed mix: the placement the done-when experiment relies on.

Three in-process fake workers that take a few milliseconds per request, six models, ``m0`` with
2 replicas, fill mode ``run``; a bounded, skewed, concurrent load through a real gateway. The
gateway's own routed counts (its control plane's ``GetSchedulingStatus``) must show every
single-replica model on one worker. The batch-depth half of the experiment (Triton's mean
batch size vs round_robin) needs real tritonservers and timing, so it lives in
``benchmarks/gateway_packing.py``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc.aio as triton_aio
from tritonclient.grpc import service_pb2_grpc

from hloserve.gateway.auth import ENV_TOKEN
from hloserve.gateway.config import GatewayConfig
from hloserve.gateway.proxy import channel_options
from hloserve.protos import gateway_control_pb2 as pb
from hloserve.protos import gateway_control_pb2_grpc as pb_grpc
from tests.gateway.test_control import TOKEN
from tests.gateway.test_proxy import LIMITS, FakeWorker, _start_gateway

MODELS = ("m0", "m1", "m2", "m3", "m4", "m5")
WEIGHTS = (0.35, 0.25, 0.15, 0.12, 0.08, 0.05)


class SlowWorker(FakeWorker):
    """A fake worker that takes 3 ms per request, so requests overlap in flight."""

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        await asyncio.sleep(0.003)
        return await super().ModelInfer(request, context)


def test_run_fill_keeps_every_single_replica_model_on_one_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every single-replica model is placed on one worker and all 320 requests are routed
    there; m0's two replicas show fill mode ``run`` with its quantum in requests. HAProxy's
    ``balance first`` fills by concurrency: there is no share guard (docs/gateway.md,
    "Removed settings")."""

    monkeypatch.setenv(ENV_TOKEN, TOKEN)  # the control plane's token, read at startup

    async def body() -> None:
        servers, endpoints = [], []
        for i in range(3):
            server = grpc.aio.server(options=channel_options(LIMITS))
            service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
                SlowWorker(f"w{i}", models=MODELS), server
            )
            endpoints.append(f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}")
            await server.start()
            servers.append(server)
        config = GatewayConfig.model_validate(
            {
                "workers": endpoints,
                "mode": "lpt_packing",
                "discovery": {"poll_interval_seconds": 60},
                "scheduling": {"routing_fill_mode": "run", "models": {"m0": {"replicas": 2}}},
            }
        )
        stop = asyncio.Event()
        task, port, _ = await _start_gateway(config, stop)
        client = triton_aio.InferenceServerClient(f"127.0.0.1:{port}")
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        try:
            tensor = triton_aio.InferInput("IN", [1, 2], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 2), np.float32))

            async def loop(seed: int) -> None:
                rng = np.random.default_rng(seed)
                for i in rng.choice(len(MODELS), size=40, p=WEIGHTS):
                    await client.infer(MODELS[i], [tensor])

            await asyncio.gather(*(loop(seed) for seed in range(8)))  # 320 requests
            for _ in range(50):  # HAProxy's counters reach the control plane within 0.5 s
                status = await pb_grpc.GatewayControlStub(channel).GetSchedulingStatus(
                    pb.GetSchedulingStatusRequest(),
                    metadata=(("authorization", f"Bearer {TOKEN}"),),
                )
                if sum(r.routed_total for m in status.models for r in m.replicas) >= 320:
                    break
                await asyncio.sleep(0.1)
        finally:
            await channel.close()
            await client.close()
            stop.set()
            await task
            for server in servers:
                await server.stop(None)

        rows = {m.name: m for m in status.models}
        routed = {n: [r.routed_total for r in rows[n].replicas] for n in MODELS}
        assert sum(map(sum, routed.values())) == 320
        for name in MODELS[1:]:
            assert len(routed[name]) == 1, routed
        m0 = rows["m0"]
        assert (m0.effective_replicas, m0.fill_mode, m0.fill_quantum) == (2, "run", 4)

    asyncio.run(asyncio.wait_for(body(), timeout=120))
