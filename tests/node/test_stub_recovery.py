"""A dead Python backend stub outside explicit model control (issue 28 item 3): Triton refuses
load and unload in ``none`` and ``poll``, so the watchdog has the worker drained (graceful
stop) and restarted after the restart backoff; on a real tritonserver under ``hloserve
serve --model-control-mode none``."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from hloserve.bundle.bundle import load_bundle
from hloserve.node.tritonserver import StubProcess
from hloserve.node.watchdog import StubWatchdog
from tests.conftest import GOLDEN
from tests.node.test_serve_cli import start_serve, stop_serve, stub_pids, wait_for_line


class NoneModeServer:
    """The watchdog's view of a server in model control mode ``none``."""

    options = SimpleNamespace(model_control_mode="none")

    def __init__(self) -> None:
        self.stubs: list[StubProcess] = []

    def stub_processes(self) -> list[StubProcess]:
        return list(self.stubs)


def test_watchdog_outside_explicit_mode_asks_for_a_worker_restart_once_per_death() -> None:
    server = NoneModeServer()
    lines: list[str] = []
    restarts: list[str] = []
    watchdog = StubWatchdog(server, None, lines.append, restarts.append)  # type: ignore[arg-type]
    server.stubs = [StubProcess(5, "digits", "1", "digits_0_0", 9)]
    watchdog.check()
    assert restarts == []  # a stub Triton reaps at once is not a death: wait one check
    watchdog.check()
    watchdog.check()
    assert restarts == ["digits"]
    assert lines == [
        "hloserve: model 'digits': Python backend stub pid 5 (digits_0_0) died (signal 9, "
        "SIGKILL); draining and restarting the worker (model control mode none cannot "
        "reload a model)"
    ]


@pytest.mark.tritonserver
@pytest.mark.timeout(600)
def test_none_mode_restarts_the_worker_whose_front_stub_was_killed(tmp_path: Path) -> None:
    grpcclient = pytest.importorskip("tritonclient.grpc")
    proc, log, grpc = start_serve(tmp_path, "--model-control-mode", "none")
    try:
        pid_line = wait_for_line(log, r"tritonserver \(pid (\d+)\)", proc, 60)
        server_pid = int(re.findall(r"\d+", pid_line)[0])
        wait_for_line(log, r"hloserve: ready after", proc, 240)
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")
        tensor = grpcclient.InferInput("x", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        b, w = load_bundle(GOLDEN / "affine").load_weights()
        expected = np.tanh(np.ones((1, 4), np.float32) @ w + b)
        np.testing.assert_allclose(
            client.infer("affine", [tensor]).as_numpy("y"), expected, rtol=1e-6
        )
        front, _ = stub_pids(server_pid, "affine")  # one of the default two instances
        os.kill(front, signal.SIGKILL)
        wait_for_line(
            log,
            rf"model 'affine': Python backend stub pid {front} \(affine_0_\d\) died \(signal 9,"
            r" SIGKILL\); draining and restarting the worker \(model control mode none",
            proc,
            30,
        )
        wait_for_line(
            log, r"worker 0 drained to recover a dead Python backend stub; restart 1", proc, 30
        )
        deadline = time.monotonic() + 240
        while True:  # bounded: the restarted worker answers on the same port
            try:
                y = client.infer("affine", [tensor], client_timeout=10).as_numpy("y")
                break
            except Exception:
                assert time.monotonic() < deadline and proc.poll() is None, log.read_text()[-3000:]
                time.sleep(0.5)
        np.testing.assert_allclose(y, expected, rtol=1e-6)
        for _ in range(10):
            y = client.infer("affine", [tensor], client_timeout=10).as_numpy("y")
            np.testing.assert_allclose(y, expected, rtol=1e-6)
        assert proc.poll() is None
    finally:
        stop_serve(proc)
