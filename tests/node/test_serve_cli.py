"""``hloserve serve`` as a user runs it: a subprocess, real signals, no process left behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from hloserve import names
from hloserve.bundle.bundle import load_bundle
from hloserve.node.procfs import session_pids
from hloserve.ports import free_ports
from tests.conftest import GOLDEN, ROOT

pytestmark = pytest.mark.tritonserver
grpcclient = pytest.importorskip("tritonclient.grpc")


def wait_for_line(log: Path, pattern: str, proc: subprocess.Popen[bytes], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace") if log.exists() else ""
        match = re.search(pattern, text)
        if match:
            return match.group(0)
        assert proc.poll() is None, f"hloserve serve exited early:\n{text[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"{pattern!r} not seen in {timeout_s} s:\n{log.read_text()[-3000:]}")


def launch_serve(
    src: Path, log: Path, *args: str, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``python -m hloserve.cli serve SRC ARGS...`` from this checkout, its output in ``log``;
    ``env`` is added to this process's environment."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "hloserve.cli", "serve", str(src), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        )


def serve_two_workers(
    src: Path, log: Path, *extra: str, env: Mapping[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], int, int, int]:
    """``hloserve serve SRC --workers 2`` (worker ports from the OS) with the gateway on free
    ports; (process, gateway gRPC, HTTP and metrics ports)."""
    http, grpc, metrics = free_ports(3)
    proc = launch_serve(
        src, log, "--workers", "2", "--worker-port-base", "0", "--grpc-port", str(grpc),
        "--http-port", str(http), "--metrics-port", str(metrics), *extra, env=env,
    )  # fmt: skip
    return proc, grpc, http, metrics


def start_serve(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[bytes], Path, int]:
    """`hloserve serve` on a bundles dir holding affine, free ports; (process, log, gRPC port)."""
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    (bundles / "affine").symlink_to(GOLDEN / "affine", target_is_directory=True)
    http, grpc, metrics = free_ports(3)
    log = tmp_path / "serve.log"
    args = ("--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics))
    return launch_serve(bundles, log, *args, *extra), log, grpc


def stop_serve(proc: subprocess.Popen[bytes]) -> None:
    """A test's cleanup: SIGTERM a serve process still running, SIGKILL it after 60 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_bundles_then_signal_leaves_no_process(tmp_path: Path, sig: signal.Signals) -> None:
    proc, log, grpc = start_serve(tmp_path, "--", "--log-info=true")
    try:
        pid_line = wait_for_line(log, r"tritonserver \(pid (\d+)\)", proc, 60)
        server_pid = int(re.findall(r"\d+", pid_line)[0])
        wait_for_line(log, r"hloserve: ready after", proc, 240)
        assert "model affine: READY" in log.read_text()
        argv = Path(f"/proc/{server_pid}/cmdline").read_bytes().split(b"\0")
        loads = [a for a in argv if a.startswith(b"--load-model")]
        assert loads == [b"--load-model=hloserve_runtime"]  # the rest once the runtime serves
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")
        tensor = grpcclient.InferInput("x", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        assert client.infer("affine", [tensor]).as_numpy("y").shape == (1, 3)
        assert session_pids(server_pid), "tritonserver and its stubs should be running"
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        stop_serve(proc)  # after a failed assertion: as a user would, then force
    assert session_pids(server_pid) == [], "processes of the server's session survived"
    assert "hloserve: stopped" in log.read_text()


def test_serve_refuses_a_directory_without_bundles_or_models(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hloserve.cli", "serve", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert result.returncode == 1
    assert "neither a bundles directory" in result.stderr


def test_serve_of_a_bundle_itself_names_the_directory_to_serve(tmp_path: Path) -> None:
    result = run_cli("serve", GOLDEN / "affine")  # the bundle, not the folder holding it
    assert result.returncode == 1
    assert "error (NOT_FOUND)" in result.stderr and "a bundle, not a bundles directory" in (
        result.stderr
    )
    assert f"serve the directory that holds it ({GOLDEN})" in result.stderr


def run_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hloserve.cli", *map(str, args)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )  # fmt: skip


def test_serve_refuses_to_replace_a_foreign_repository_out(tmp_path: Path) -> None:
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    (bundles / "affine").symlink_to(GOLDEN / "affine", target_is_directory=True)
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    result = run_cli("serve", bundles, "--repository-out", precious)
    assert result.returncode == 1
    assert "error (FAILED_PRECONDITION)" in result.stderr and "not a repository hloserve built" in (
        result.stderr
    )
    assert (precious / "notes.txt").read_text() == "keep me"


def test_serve_refuses_bad_ports_before_starting(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text('name: "m"')
    result = run_cli("serve", tmp_path, "--http-port", "70000")
    assert result.returncode == 1 and "HTTP port 70000 is not in 1..65535" in result.stderr
    result = run_cli("serve", tmp_path, "--http-port", "9000", "--grpc-port", "9000")
    assert result.returncode == 1 and "three different ports" in result.stderr


def test_serve_refuses_bad_options_before_building(tmp_path: Path) -> None:
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    (bundles / "affine").symlink_to(GOLDEN / "affine", target_is_directory=True)
    out = tmp_path / "repo"
    for args, message in [
        (
            ("--front-instances", "-1"),  # 0 is the default
            "error (INVALID_ARGUMENT): --front-instances must be at least 0",
        ),
        (("--host", "999.1.1.1"), "error (INVALID_ARGUMENT): cannot resolve host '999.1.1.1'"),
    ]:
        result = run_cli("serve", bundles, "--repository-out", out, *args)
        assert result.returncode == 1 and message in result.stderr, result.stderr
        assert not out.exists(), "the repository was built before the options were checked"


def test_explicit_mode_loads_the_runtime_with_the_named_models(tmp_path: Path) -> None:
    from hloserve.node.serve_options import ServeOptions, server_options

    options = ServeOptions(path=tmp_path, model_control_mode="explicit", load_models=("digits",))
    assert tuple(server_options(options, tmp_path).load_models) == ("digits", "hloserve_runtime")


def test_sigkill_of_serve_takes_tritonserver_down_too(tmp_path: Path) -> None:
    proc, log, _ = start_serve(tmp_path)
    pid_line = wait_for_line(log, r"tritonserver \(pid (\d+)\)", proc, 60)
    server_pid = int(re.findall(r"\d+", pid_line)[0])
    wait_for_line(log, r"hloserve: ready after", proc, 240)
    proc.kill()
    proc.wait(timeout=30)
    deadline = time.monotonic() + 60
    while session_pids(server_pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    leftover = session_pids(server_pid)
    for pid in leftover:  # never leave a server behind, even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert leftover == [], "tritonserver outlived a SIGKILLed `hloserve serve`"


def stub_pids(server_pid: int, model: str) -> list[int]:
    """Live Python backend stubs of ``model`` in the server's session (command line names
    ``<repository>/<model>/1/model.py``)."""
    found = []
    for pid in session_pids(server_pid):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if argv[0].endswith(b"triton_python_backend_stub") and argv[1].endswith(
            f"/{model}/1/model.py".encode()
        ):
            found.append(pid)
    return found


def test_serve_reloads_a_model_whose_stub_was_killed(tmp_path: Path) -> None:
    proc, log, grpc = start_serve(tmp_path)
    try:
        pid_line = wait_for_line(log, r"tritonserver \(pid (\d+)\)", proc, 60)
        server_pid = int(re.findall(r"\d+", pid_line)[0])
        wait_for_line(log, r"hloserve: ready after", proc, 240)
        front, runtime = stub_pids(server_pid, "affine"), stub_pids(server_pid, "hloserve_runtime")
        # the default instances; one of the two front stubs dies
        assert len(front) == names.DEFAULT_FRONT_INSTANCES == 2 and len(runtime) == 1, (
            front,
            runtime,
        )
        os.kill(front[0], signal.SIGKILL)
        os.kill(runtime[0], signal.SIGKILL)
        for model, pid in (("affine", front[0]), ("hloserve_runtime", runtime[0])):
            wait_for_line(
                log,
                rf"model '{model}': Python backend stub pid {pid} \({model}_0_\d\) died "
                r"\(signal 9, SIGKILL\); reloading",
                proc,
                30,
            )
            wait_for_line(log, rf"model '{model}': reloaded", proc, 120)
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")
        tensor = grpcclient.InferInput("x", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        b, w = load_bundle(GOLDEN / "affine").load_weights()
        expected = np.tanh(np.ones((1, 4), np.float32) @ w + b)
        for _ in range(20):  # the front serves again; every request succeeds
            y = client.infer("affine", [tensor]).as_numpy("y")
            np.testing.assert_allclose(y, expected, rtol=1e-6)
        assert front[0] not in stub_pids(server_pid, "affine")
    finally:
        stop_serve(proc)


def test_one_worker_serve_restarts_a_killed_tritonserver(tmp_path: Path) -> None:
    """``serve`` with one worker runs under the supervisor of ``node up``: a tritonserver that
    dies is restarted (policy on-failure) on the same ports and serves again."""
    proc, log, grpc = start_serve(tmp_path)
    try:
        pid_line = wait_for_line(log, r"tritonserver \(pid (\d+)\)", proc, 60)
        wait_for_line(log, r"hloserve: ready after", proc, 240)
        os.kill(int(re.findall(r"\d+", pid_line)[0]), signal.SIGKILL)
        wait_for_line(log, r"worker 0 was killed by SIGKILL; restart 1 in", proc, 30)
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")
        tensor = grpcclient.InferInput("x", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        deadline = time.monotonic() + 180
        while True:  # back once the new server has loaded affine after the runtime
            try:
                assert client.infer("affine", [tensor]).as_numpy("y").shape == (1, 3)
                break
            except Exception:
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                assert proc.poll() is None, log.read_text()[-3000:]
                time.sleep(0.5)
    finally:
        stop_serve(proc)
    assert proc.returncode == 0, log.read_text()[-3000:]
