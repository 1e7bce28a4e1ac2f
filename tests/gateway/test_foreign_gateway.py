"""The gateway places a foreign model by its ``memory_bytes`` hint (docs/gateway.md).

``hloserve serve SRC --workers 2`` in ``lpt_packing`` mode over digits (a bundle) and
``plus_one`` (a Triton Python model with its config, and an ``hloserve.yaml`` whose
``memory_bytes`` says 7 MiB): the runtime of each worker publishes the hint as
``hloserve_weight_bytes{model="plus_one", residency="foreign"}``, and the gateway's control
plane (``gateway-ctl status``) and admin port show ``plus_one`` placed with that size, outside
the weight budget.
"""

from __future__ import annotations

import shutil
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.node.test_serve_cli import run_cli, serve_two_workers, stop_serve, wait_for_line

pytestmark = [pytest.mark.tritonserver, pytest.mark.slow, pytest.mark.timeout(600)]
grpcclient = pytest.importorskip("tritonclient.grpc")

MODELS = Path(__file__).resolve().parents[1] / "foreign_models"
HINT = 7 * 2**20


def _status(grpc_port: int) -> Any:
    import grpc

    from hloserve.protos import gateway_control_pb2 as pb
    from hloserve.protos import gateway_control_pb2_grpc as pb_grpc
    from tests.gateway.test_control import TOKEN

    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = pb_grpc.GatewayControlStub(channel)
        bearer = (("authorization", f"Bearer {TOKEN}"),)
        return stub.GetSchedulingStatus(
            pb.GetSchedulingStatusRequest(), timeout=10, metadata=bearer
        )


def _plus_one(grpc_port: int, x: np.ndarray) -> np.ndarray:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result: np.ndarray = client.infer("plus_one", [tensor]).as_numpy("y")
    return result


def test_lpt_packing_places_a_foreign_model_by_its_memory_hint(
    digits_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hloserve.gateway.auth import ENV_TOKEN
    from tests.gateway.test_control import TOKEN

    monkeypatch.setenv(ENV_TOKEN, TOKEN)  # serve's gateway and gateway-ctl read it
    src = tmp_path / "src"
    src.mkdir()
    shutil.copytree(digits_bundle, src / "digits")
    shutil.copytree(
        MODELS / "plus_one", src / "plus_one", ignore=shutil.ignore_patterns("__pycache__")
    )
    (src / "plus_one" / "hloserve.yaml").write_text(f"memory_bytes: {HINT}\n")
    config = tmp_path / "gateway.yaml"
    config.write_text("mode: lpt_packing\ndiscovery: {poll_interval_seconds: 1}\n")
    log = tmp_path / "serve.log"
    proc, grpc_port, _, admin_port = serve_two_workers(
        src, log, "--admin-port", "0", "--scheduling", "fifo", "--front-instances", "1",
        "--gateway-config", str(config),
        env={"HLOSERVE_PROMETHEUS_TARGETS_DIR": str(tmp_path / "targets")},
    )  # fmt: skip
    try:
        wait_for_line(log, r"hloserve: ready after", proc, 300)
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        np.testing.assert_array_equal(_plus_one(grpc_port, x), x + 1)
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        image = grpcclient.InferInput("image", [1, 8, 8, 1], "FP32")
        image.set_data_from_numpy(np.zeros((1, 8, 8, 1), np.float32))
        client.infer("digits", [image])  # its weights are registered once it answers

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # discovery reads the workers' metrics each second
            rows = {m.name: m for m in _status(grpc_port).models}
            if rows["plus_one"].weight_bytes == HINT and rows["digits"].weight_bytes:
                break
            time.sleep(0.5)
        assert rows["plus_one"].weight_bytes == HINT, rows
        digits_bytes = rows["digits"].weight_bytes
        assert 0 < digits_bytes < HINT

        repacked = run_cli("gateway-ctl", "--address", f"127.0.0.1:{grpc_port}", "repack")
        assert repacked.returncode == 0, repacked.stderr
        status = _status(grpc_port)
        placed = {m.name: [r.worker for r in m.replicas] for m in status.models}
        assert len(placed["plus_one"]) == 1  # default_replicas 1
        by_worker = {w.worker: w.weight_bytes for w in status.workers}
        assert sum(by_worker.values()) == HINT + digits_bytes
        assert by_worker[placed["plus_one"][0]] >= HINT
        assert all(w.weight_budget_bytes == 0 for w in status.workers)  # no budget: unlimited

        shown = run_cli("gateway-ctl", "--address", f"127.0.0.1:{grpc_port}", "status")
        assert shown.returncode == 0, shown.stderr
        line = next(row for row in shown.stdout.splitlines() if "plus_one" in row)
        assert "7.0 MiB" in line and placed["plus_one"][0] in line, shown.stdout

        url = f"http://127.0.0.1:{admin_port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        assert (
            f'hloserve_gateway_placement{{model="plus_one",worker="{placed["plus_one"][0]}"}} 1.0'
            in text
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0, log.read_text()[-3000:]
    finally:
        stop_serve(proc)
