"""The gateway's control plane over real gRPC on loopback (docs/gateway.md, "Control plane";
issue 5).

A real ``run_gateway`` (lpt_packing and round_robin) over three in-process fake workers
(tests/gateway/test_proxy.py's ``FakeWorker``), driven through ``hloserve gateway-ctl`` and the
generated stub.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.grpc import service_pb2_grpc

from hloserve.cli import main
from hloserve.errors import InvalidArgumentError
from hloserve.gateway.app import run_gateway
from hloserve.gateway.config import GatewayConfig
from hloserve.gateway.ctl import parse_knob, parse_replicas, print_status, render_status
from hloserve.gateway.proxy import channel_options
from hloserve.protos import gateway_control_pb2 as pb
from hloserve.protos import gateway_control_pb2_grpc as pb_grpc
from tests.gateway.test_proxy import LIMITS, FakeWorker

#: The gateways' control token (docs/gateway.md, "Control plane: authentication").
TOKEN = "test-control-token-0123456789"


class Fleet:
    """Three fake workers and two gateways (lpt_packing, round_robin) on one loop thread,
    whose control plane takes :data:`TOKEN` (in the file :attr:`token_file`)."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory()
        self.token_file = Path(self._dir.name) / "token"
        self.token_file.write_text(TOKEN + "\n")
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.ports: dict[str, int] = {}
        self.workers: list[str] = []
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._main(),))
        self._thread.start()
        assert self._ready.wait(30), "gateways did not start"

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        servers = []
        for i in range(3):
            server = grpc.aio.server(options=channel_options(LIMITS))
            service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
                FakeWorker(f"w{i}", models=("a", "b")), server
            )
            self.workers.append(f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}")
            await server.start()
            servers.append(server)
        tasks = []
        for mode in ("lpt_packing", "round_robin"):
            config = GatewayConfig.model_validate(
                {
                    "workers": self.workers,
                    "mode": mode,
                    "discovery": {"poll_interval_seconds": 60},
                    "auth": {"token_file": str(self.token_file)},
                }
            )
            started = asyncio.Event()

            def on_ready(port: int, admin: int, mode: str = mode, started: Any = started) -> None:
                self.ports[mode] = port
                started.set()

            tasks.append(
                asyncio.create_task(
                    run_gateway(
                        config, self._stop, listen="127.0.0.1:0", admin_port=0, on_ready=on_ready
                    )
                )
            )
            await asyncio.wait_for(started.wait(), 20)
        self._ready.set()
        await asyncio.gather(*tasks)
        for server in servers:
            await server.stop(None)

    def close(self) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        self._loop.close()
        self._dir.cleanup()


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    f = Fleet()
    yield f
    f.close()


def _stub(port: int) -> Iterator[pb_grpc.GatewayControlStub]:
    """A stub whose calls carry ``authorization: Bearer`` :data:`TOKEN` (plaintext: local
    channel credentials)."""
    creds = grpc.composite_channel_credentials(
        grpc.local_channel_credentials(), grpc.access_token_call_credentials(TOKEN)
    )
    with grpc.secure_channel(f"127.0.0.1:{port}", creds) as channel:
        yield pb_grpc.GatewayControlStub(channel)


@pytest.fixture
def lpt(fleet: Fleet) -> Iterator[pb_grpc.GatewayControlStub]:
    yield from _stub(fleet.ports["lpt_packing"])


def ctl(fleet: Fleet, mode: str, *args: str) -> int:
    address = f"127.0.0.1:{fleet.ports[mode]}"
    return main(["gateway-ctl", "--address", address, "--token-file", str(fleet.token_file), *args])


def test_status_reports_mode_knobs_placement_and_workers(
    fleet: Fleet,
    lpt: pb_grpc.GatewayControlStub,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps captured output at 80 columns otherwise
    status = lpt.GetSchedulingStatus(pb.GetSchedulingStatusRequest())
    assert status.mode == "lpt_packing"
    assert status.knobs.routing_fill_mode == "run"
    assert status.knobs.default_replicas.count == 1
    assert [m.name for m in status.models] == ["a", "b"]
    for m in status.models:
        assert (m.effective_replicas, m.max_batch, m.fill_quantum) == (1, 4, 4)
        assert m.replicas[0].worker in fleet.workers
    assert [w.worker for w in status.workers] == fleet.workers
    assert sum(w.models_placed for w in status.workers) == 2
    assert status.repack.repacks >= 1
    # KServe clients on the same port are unaffected.
    client = triton_grpc.InferenceServerClient(f"127.0.0.1:{fleet.ports['lpt_packing']}")
    assert client.is_server_live()
    client.close()

    assert ctl(fleet, "lpt_packing", "status") == 0
    out = capsys.readouterr().out
    assert "lpt_packing" in out and "routing_fill_mode" in out
    assert fleet.workers[2] in out


def test_set_replicas_then_repack_spreads_the_model(
    fleet: Fleet, lpt: pb_grpc.GatewayControlStub, capsys: pytest.CaptureFixture[str]
) -> None:
    assert ctl(fleet, "lpt_packing", "set-replicas", "a", "2") == 0
    assert "a: replicas 2 (now on 1" in capsys.readouterr().out
    assert ctl(fleet, "lpt_packing", "repack") == 0
    assert "repacked" in capsys.readouterr().out
    row = next(
        m for m in lpt.GetSchedulingStatus(pb.GetSchedulingStatusRequest()).models if m.name == "a"
    )
    assert (row.configured_replicas.count, row.effective_replicas) == (2, 2)
    reply = lpt.SetModelReplicas(
        pb.SetModelReplicasRequest(model="a", replicas=pb.Replicas(all=True))
    )
    assert reply.configured_replicas.all
    lpt.Repack(pb.RepackRequest())
    row = next(
        m for m in lpt.GetSchedulingStatus(pb.GetSchedulingStatusRequest()).models if m.name == "a"
    )
    assert row.effective_replicas == 3


def test_fill_mode_and_knobs_change_live(
    fleet: Fleet, lpt: pb_grpc.GatewayControlStub, capsys: pytest.CaptureFixture[str]
) -> None:
    assert ctl(fleet, "lpt_packing", "set-fill-mode", "b", "spread") == 0
    assert "b: fill mode spread (quantum 4)" in capsys.readouterr().out
    assert ctl(fleet, "lpt_packing", "set", "routing_fill_factor", "2") == 0
    assert "routing_fill_factor = 2" in capsys.readouterr().out
    assert ctl(fleet, "lpt_packing", "set", "default_replicas", "all") == 0
    status = lpt.GetSchedulingStatus(pb.GetSchedulingStatusRequest())
    assert status.knobs.routing_fill_factor == 2.0 and status.knobs.default_replicas.all
    b = next(m for m in status.models if m.name == "b")
    assert (b.fill_mode, b.fill_quantum) == ("spread", 8)
    reply = lpt.SetKnobs(pb.SetKnobsRequest(knobs=pb.Knobs(hysteresis=0.25)))
    assert reply.knobs.hysteresis == 0.25
    with pytest.raises(grpc.RpcError) as info:  # removed with the Python data plane
        lpt.SetKnobs(pb.SetKnobsRequest(knobs=pb.Knobs(routing_policy="fill_rr")))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "routing_policy was removed" in info.value.details()
    assert "routing_fill_mode" in info.value.details()


def test_invalid_values_are_invalid_argument_naming_the_field(
    fleet: Fleet, lpt: pb_grpc.GatewayControlStub, capsys: pytest.CaptureFixture[str]
) -> None:
    before = lpt.GetSchedulingStatus(pb.GetSchedulingStatusRequest()).knobs
    assert ctl(fleet, "lpt_packing", "set", "hysteresis", "1.5") == 1
    err = capsys.readouterr().err
    assert "error (INVALID_ARGUMENT): scheduling.hysteresis:" in err and "less than 1" in err
    with pytest.raises(grpc.RpcError) as info:  # all or nothing: the valid change is dropped
        lpt.SetKnobs(pb.SetKnobsRequest(knobs=pb.Knobs(hysteresis=0.5, routing_fill_mode="x")))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "scheduling.routing_fill_mode" in info.value.details()
    assert lpt.GetSchedulingStatus(pb.GetSchedulingStatusRequest()).knobs == before
    with pytest.raises(grpc.RpcError) as info:
        lpt.SetModelFillMode(pb.SetModelFillModeRequest(model="a", fill_mode="inflight"))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "scheduling.models.a.fill_mode" in info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        lpt.SetModelReplicas(pb.SetModelReplicasRequest(model="a", replicas=pb.Replicas(count=0)))
    assert "scheduling.models.a.replicas" in info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        lpt.SetKnobs(pb.SetKnobsRequest())
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert ctl(fleet, "lpt_packing", "set-replicas", "nope", "2") == 1
    assert "error (NOT_FOUND): model 'nope' is not served" in capsys.readouterr().err


def test_round_robin_reports_status_and_refuses_changes(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    for stub in _stub(fleet.ports["round_robin"]):
        status = stub.GetSchedulingStatus(pb.GetSchedulingStatusRequest())
        assert status.mode == "round_robin" and not status.HasField("repack")
        assert all(m.effective_replicas == 3 for m in status.models)
        with pytest.raises(grpc.RpcError) as info:
            stub.Repack(pb.RepackRequest())
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert ctl(fleet, "round_robin", "set-fill-mode", "a", "spread") == 1
    assert "error (FAILED_PRECONDITION): set-fill-mode needs mode lpt_packing" in (
        capsys.readouterr().err
    )


def test_command_line_values_are_typed_before_sending() -> None:
    assert parse_replicas("all", "n") == "all" and parse_replicas("3", "n") == 3
    assert parse_knob("hysteresis", "0.2") == 0.2
    assert parse_knob("forbid_memory_oversubscription", "false") is False
    with pytest.raises(InvalidArgumentError, match="replicas: expected a positive integer"):
        parse_replicas("0", "replicas")
    with pytest.raises(InvalidArgumentError, match="hysteresis: expected a number"):
        parse_knob("hysteresis", "lots")
    with pytest.raises(InvalidArgumentError, match="expected true or false"):
        parse_knob("forbid_memory_oversubscription", "maybe")
    with pytest.raises(InvalidArgumentError, match="unknown knob 'mode'"):
        parse_knob("mode", "round_robin")


def test_unreachable_gateway_is_unavailable(capsys: pytest.CaptureFixture[str]) -> None:
    from hloserve.ports import free_ports

    (port,) = free_ports(1)
    assert main(["gateway-ctl", "--address", f"127.0.0.1:{port}", "--timeout", "2", "status"]) == 1
    assert f"error (UNAVAILABLE): gateway 127.0.0.1:{port} not reachable" in capsys.readouterr().err


def test_status_never_cuts_worker_addresses(
    fleet: Fleet, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 80 columns (what rich assumes when piped) addresses are printed whole."""
    import io

    from rich.console import Console

    monkeypatch.setenv("COLUMNS", "80")
    assert ctl(fleet, "lpt_packing", "status") == 0
    out = capsys.readouterr().out
    for worker in fleet.workers:
        assert worker in out
    assert "…" not in out
    status = pb.SchedulingStatus(mode="lpt_packing")
    long = "worker-node-17.cluster.example.internal:8101"
    status.workers.add(worker=long, compute_share=0.25, pressure=0.5)
    status.models.add(name="digits", effective_replicas=1).replicas.add(worker=long)
    buffer = io.StringIO()
    print_status(Console(file=buffer, width=80), render_status(status))
    text = buffer.getvalue()
    assert text.count(long) == 2 and "…" not in text and "0.250" in text


def test_a_tritonserver_port_is_named_as_not_a_gateway(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    worker = fleet.workers[0]  # serves inference.GRPCInferenceService only
    assert (
        main(["gateway-ctl", "--address", worker, "--token-file", str(fleet.token_file), "status"])
        == 1
    )
    assert (
        f"error (UNIMPLEMENTED): {worker} does not serve the hloserve gateway control plane "
        "(is it a tritonserver port? use the gateway's gRPC port)"
    ) in capsys.readouterr().err
