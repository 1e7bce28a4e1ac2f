"""An ensemble is placed and routed with its steps, as a meta with its callees (issue 27 item
5; hloserve/gateway/discovery.py ``group_calls``): the gateway reads the steps from the
ensemble's ``ensemble_scheduling`` through ModelConfig.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from hloserve.gateway.discovery import discover_table, group_calls
from hloserve.gateway.upstreams import Upstreams, channel_options
from hloserve.names import META_BACKEND, PARAM_META_CALLS
from tests.gateway.test_proxy import LIMITS, FakeWorker


def _ensemble(name: str, steps: list[str]) -> model_config_pb2.ModelConfig:
    config = model_config_pb2.ModelConfig(name=name, platform="ensemble", max_batch_size=4)
    for step in steps:
        config.ensemble_scheduling.step.add(model_name=step, model_version=-1)
    return config


def test_group_calls_reads_an_ensembles_steps_a_metas_callees_and_nothing_else() -> None:
    assert group_calls(_ensemble("e", ["a", "b", "a", "c"])) == ("a", "b", "c")
    meta = model_config_pb2.ModelConfig(name="m", backend=META_BACKEND)
    meta.parameters[PARAM_META_CALLS].string_value = "x,y"
    assert group_calls(meta) == ("x", "y")
    assert group_calls(model_config_pb2.ModelConfig(name="p", backend="python")) == ()


class EnsembleWorker(FakeWorker):
    """A fake worker whose ``ens`` is an ensemble of ``echo`` and ``other``."""

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        if request.name == "ens":
            return service_pb2.ModelConfigResponse(config=_ensemble("ens", ["echo", "other"]))
        return await super().ModelConfig(request, context)


def test_an_ensemble_is_routed_only_to_workers_serving_all_its_steps() -> None:
    async def body() -> None:
        workers = [
            EnsembleWorker("w0", models=("echo", "other", "ens")),
            EnsembleWorker("w1", models=("echo", "ens")),  # lacks the step 'other'
        ]
        servers, endpoints = [], []
        for worker in workers:
            server = grpc.aio.server(options=channel_options(LIMITS))
            service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(worker, server)
            endpoints.append(f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}")
            await server.start()
            servers.append(server)
        upstreams = Upstreams(endpoints, LIMITS)
        try:
            table = await discover_table(upstreams, 5.0)
        finally:
            await upstreams.close()
            await asyncio.gather(*(s.stop(None) for s in servers))
        ens = table.get("ens")
        assert ens is not None
        assert ens.replicas == (endpoints[0],) and ens.calls == ("echo", "other")
        echo = table.get("echo")
        assert echo is not None and echo.replicas == tuple(endpoints)

    asyncio.run(asyncio.wait_for(body(), timeout=60))
