"""The stub watchdog of the docker ``tritonserver`` launcher (issue 28 item 3), on the real
Docker daemon: a worker container's Python backend stub SIGKILLed from the host; in explicit
mode ``node up``'s poll reloads the model through the repository API, in ``none`` it restarts
the container gracefully after the restart backoff. The image is the CPU worker image made
runnable by that launcher (tests/node/docker_image.py)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hloserve import names
from hloserve.bundle.bundle import load_bundle
from hloserve.errors import NodeError
from hloserve.model_repository_tools.build import build_repository
from tests.conftest import GOLDEN as GOLDEN_DIR
from tests.node.docker_image import MEMLOCK, ensure_tritonserver_launcher_image
from tests.node.node_testing import contiguous_free_ports, two_worker_ports

pytestmark = [
    pytest.mark.docker,
    pytest.mark.tritonserver,
    pytest.mark.slow,
    pytest.mark.timeout(900),
]

docker = pytest.importorskip("docker")
grpcclient = pytest.importorskip("tritonclient.grpc")

RECOVERY_S = 240.0
GOLDEN = GOLDEN_DIR / "affine"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("docker_stubs")
    (work / "bundles").mkdir()
    os.symlink(GOLDEN, work / "bundles" / "affine")
    build_repository(work / "bundles", work / "repository")
    for path in [work, *work.rglob("*")]:  # the container runs as UID 10001
        path.chmod(path.stat().st_mode | 0o055 if path.is_dir() else path.stat().st_mode | 0o044)
    return work / "repository"


@pytest.fixture(scope="module")
def image() -> str:
    from hloserve.node.docker_runtime import connect

    try:
        connect().close()
    except NodeError as exc:
        if os.environ.get("HLOSERVE_REQUIRE_DOCKER") == "1":
            pytest.fail(f"HLOSERVE_REQUIRE_DOCKER=1 but {exc}")
        pytest.skip(str(exc))
    return ensure_tritonserver_launcher_image()


def workers(image: str, repository: Path, mode: str) -> Any:
    """Started and ready DockerWorkers: one CPU worker of the ``tritonserver`` launcher."""
    from hloserve.model_control import new_key
    from hloserve.node.docker_runtime import DockerWorkers
    from hloserve.node.node_config import NodeConfig
    from hloserve.node.plan import plan_workers

    config = NodeConfig.model_validate(
        {
            "name": f"hlostub{os.getpid()}{mode}",
            "runtime": "docker",
            "repository": str(repository),
            "cpu_workers": 1,
            "ports": two_worker_ports(contiguous_free_ports(3)),
            "restart": {"policy": "on-failure", "max_retries": 3},
            "tritonserver": {"startup_timeout_s": RECOVERY_S, "model_control_mode": mode},
            "docker": {
                "image": image,
                "launcher": "tritonserver",
                "stop_timeout_s": 10,
                "ulimits": {"memlock": MEMLOCK, "stack": 67108864},
            },
        }
    )
    node = DockerWorkers(config, plan_workers(config), new_key() if mode == "explicit" else None)
    try:
        node.start()
        assert node.wait_ready(threading.Event()) is not None
    except BaseException:
        node.stop()
        raise
    return node


@pytest.fixture
def explicit(image: str, repository: Path) -> Iterator[Any]:
    node = workers(image, repository, "explicit")
    yield node
    node.stop()


@pytest.fixture
def none_mode(image: str, repository: Path) -> Iterator[Any]:
    node = workers(image, repository, "none")
    yield node
    node.stop()


def infer(node: Any) -> str:
    """One affine request to the worker: "OK" (answer checked) or the status and message."""
    from tritonclient.utils import InferenceServerException

    b, w = load_bundle(GOLDEN).load_weights()
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
    tensor = grpcclient.InferInput("x", [2, 4], "FP32")
    tensor.set_data_from_numpy(x)
    with grpcclient.InferenceServerClient(f"127.0.0.1:{node.plan[0].grpc_port}") as client:
        try:
            reply = client.infer("affine", [tensor], client_timeout=30.0)
        except InferenceServerException as exc:
            return f"{exc.status()} {exc.message()}"
    np.testing.assert_allclose(reply.as_numpy("y"), np.tanh(x @ w + b), rtol=1e-5, atol=1e-6)
    return "OK"


def kill_stubs(node: Any, model: str) -> list[int]:
    """SIGKILL every stub of ``model`` (each front instance's) in worker 0's container (host
    pids), so that the model serves again only once recovered; their pids."""
    from hloserve.node.docker_runtime import ContainerStubs

    container = node._containers[0]
    container.reload()
    stubs = [s for s in ContainerStubs(container, node.config.tritonserver).stub_processes()]
    pids = [s.pid for s in stubs if s.model == model and not s.dead]
    assert len(pids) == names.DEFAULT_FRONT_INSTANCES, f"stubs of {model!r}: {stubs}"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return pids


def recover(node: Any) -> tuple[float, list[str]]:
    """Poll the node (as ``node up`` does, every 0.5 s) until a request is answered again;
    the seconds it took and the failures met."""
    start = time.monotonic()
    failures: list[str] = []
    while time.monotonic() - start < RECOVERY_S:
        assert node.poll() is None
        answer = infer(node)
        if answer == "OK":
            return time.monotonic() - start, failures
        failures.append(answer)
        time.sleep(0.5)
    raise AssertionError(f"not serving {RECOVERY_S:g} s after the kill: {failures[-3:]}")


def test_explicit_mode_reloads_the_model_of_a_dead_stub(
    explicit: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert infer(explicit) == "OK"
    pids = kill_stubs(explicit, "affine")
    took, failures = recover(explicit)
    out = capsys.readouterr().out
    print(f"recovered in {took:.1f} s; failures {failures[:2]}")
    assert any(f"stub pid {pid}" in out for pid in pids) and "reloading" in out, out[-3000:]
    assert "model 'affine': reloaded" in out, out[-3000:]
    assert all("not healthy" in f for f in failures), failures


def test_none_mode_restarts_the_container_after_the_backoff(
    none_mode: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert infer(none_mode) == "OK"
    kill_stubs(none_mode, "affine")
    took, failures = recover(none_mode)
    out = capsys.readouterr().out
    print(f"recovered in {took:.1f} s; failures {sorted(set(f[:60] for f in failures))}")
    assert "restart 1 in 0.1 s to recover a dead Python backend stub" in out, out[-3000:]
    assert "draining and restarting the worker" in out, out[-3000:]
