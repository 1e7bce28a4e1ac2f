"""The CPU worker image (containers/worker-cpu.Dockerfile) run as one container.

One container for the module, started as a deployment would: host network, a private IPC
namespace with its own /dev/shm, the repository mounted read-only, the executable cache on a
named volume, explicit model control (digits loaded at start). Besides ``digits`` the
repository holds ``slowload``, a Triton Python-backend model whose ``initialize`` sleeps:
loading it while the server already answers shows the image's HEALTHCHECK failing until every
model is READY. perf_analyzer (the host's, from tritonclient) measures digits in the container.
"""

from __future__ import annotations

import os
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hloserve.model_repository_tools.build import build_repository
from hloserve.ports import free_ports
from tests.containers.conftest import world_readable
from tests.node.docker_image import IMAGE_UID, Images
from tests.node.node_testing import ready

pytestmark = [
    pytest.mark.docker,
    pytest.mark.tritonserver,
    pytest.mark.slow,
    pytest.mark.timeout(900),
]

KEY = "hlotest-model-control-key"
SLOW_LOAD_S = 15
_SLOW_CONFIG = """name: "slowload"
backend: "python"
max_batch_size: 0
input [{ name: "X", data_type: TYPE_FP32, dims: [ 1 ] }]
output [{ name: "Y", data_type: TYPE_FP32, dims: [ 1 ] }]
"""
_SLOW_MODEL = f"""import time


class TritonPythonModel:
    def initialize(self, args):
        time.sleep({SLOW_LOAD_S})

    def execute(self, requests):
        return []
"""


class Worker:
    def __init__(self, container: Any, http: str, grpc: str, volume: str) -> None:
        self.container, self.http, self.grpc, self.volume = container, http, grpc, volume

    def health(self, env: dict[str, str] | None = None) -> tuple[int, str]:
        """Run the image's HEALTHCHECK command in the container: (exit code, its output)."""
        test = self.container.attrs["Config"]["Healthcheck"]["Test"]
        assert test[0] == "CMD", test
        code, out = self.container.exec_run(test[1:], environment=env)
        return code, out.decode()


@pytest.fixture(scope="module")
def worker(
    docker_client: Any,
    images: Images,
    digits_bundle: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Worker]:
    work = tmp_path_factory.mktemp("worker_image")
    (work / "bundles").mkdir()
    os.symlink(digits_bundle, work / "bundles" / "digits")
    repository = work / "repository"
    build_repository(work / "bundles", repository)
    (repository / "slowload" / "1").mkdir(parents=True)
    (repository / "slowload" / "config.pbtxt").write_text(_SLOW_CONFIG)
    (repository / "slowload" / "1" / "model.py").write_text(_SLOW_MODEL)
    world_readable(repository)
    http, grpc, metrics = free_ports(3)
    volume = f"hlotest-executables-{os.getpid()}"
    container = docker_client.containers.run(
        images.worker_cpu,
        [
            "hloserve",
            "serve",
            "/models",
            "--host=127.0.0.1",
            f"--http-port={http}",
            f"--grpc-port={grpc}",
            f"--metrics-port={metrics}",
            "--model-control-mode=explicit",
            "--load-model=digits",
        ],
        name=f"hlotest-worker-{os.getpid()}",
        environment={"HLOSERVE_MODEL_CONTROL_KEY": KEY},
        network_mode="host",
        ipc_mode="private",
        shm_size="256m",
        volumes={
            str(repository): {"bind": "/models", "mode": "ro"},
            volume: {"bind": "/var/cache/hloserve/executables", "mode": "rw"},
        },
        init=True,
        detach=True,
    )
    handle = Worker(container, f"127.0.0.1:{http}", f"127.0.0.1:{grpc}", volume)
    try:
        # `hloserve serve` loads the runtime model first and digits once Triton answers ready:
        # wait for the model, not only the server
        deadline = time.monotonic() + 300
        while not ready(handle.http, "digits") and time.monotonic() < deadline:
            container.reload()
            assert container.status == "running", container.logs()[-3000:].decode()
            time.sleep(0.5)
        assert ready(handle.http, "digits"), container.logs()[-3000:].decode()
        yield handle
    finally:
        container.remove(force=True)
        docker_client.volumes.get(volume).remove(force=True)


def test_the_worker_runs_as_a_non_root_user(worker: Worker) -> None:
    worker.container.reload()
    assert worker.container.attrs["Config"]["User"] == "hloserve"
    code, out = worker.container.exec_run(["id", "-u"])
    assert (code, out.decode().strip()) == (0, str(IMAGE_UID))
    # the named volume starts as the image's directory: owned by the user, private
    code, out = worker.container.exec_run(
        ["stat", "-c", "%u %a", "/var/cache/hloserve/executables"]
    )
    assert (code, out.decode().split()) == (0, [str(IMAGE_UID), "700"])
    code, out = worker.container.exec_run(["df", "-m", "--output=size", "/dev/shm"])
    assert code == 0 and out.decode().split()[-1] == "256", out


def test_the_image_keeps_no_pip_configuration(docker_client: Any, worker: Worker) -> None:
    """The host's pip.conf and certificate authority stayed in the build stage."""
    code, out = worker.container.exec_run(["ls", "/etc/hloserve-pip"])
    assert code != 0, out
    code, out = worker.container.exec_run(["env"])
    assert "PIP_CONFIG_FILE" not in out.decode()
    history = docker_client.api.history(worker.container.image.id)
    assert not any("hloserve-pip" in (layer["CreatedBy"] or "") for layer in history)


def test_healthcheck_fails_while_a_model_loads_though_the_server_answers(worker: Worker) -> None:
    code, out = worker.health()
    assert code == 0 and out.endswith("models READY\n"), out  # digits and the runtime model
    before = int(out.split()[0])
    # without the key the index answers 403: the load list's models are asked one by one
    assert worker.health({"HLOSERVE_MODEL_CONTROL_KEY": ""}) == (0, "1 models READY\n")
    loaded: list[int] = []

    def load() -> None:
        request = urllib.request.Request(
            f"http://{worker.http}/v2/repository/models/slowload/load",
            data=b"{}",
            method="POST",
            headers={"hloserve-model-control": KEY},
        )
        with urllib.request.urlopen(request, timeout=SLOW_LOAD_S + 60) as answer:
            loaded.append(answer.status)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    time.sleep(2)  # the load has begun; initialize sleeps SLOW_LOAD_S
    code, out = worker.health()
    assert ready(worker.http)  # Triton itself says ready (--strict-readiness=false)
    assert code == 1 and "slowload: LOADING" in out, out
    thread.join(timeout=SLOW_LOAD_S + 60)
    assert loaded == [200]
    code, out = worker.health()
    assert (code, out) == (0, f"{before + 1} models READY\n")


def test_perf_analyzer_gets_answers_with_zero_errors(worker: Worker) -> None:
    from hloserve.node.perf_analyzer import run_perf_analyzer

    results, output = run_perf_analyzer(
        "digits",
        worker.grpc,
        concurrency=(2,),
        request_count=200,  # answers and errors are the point, not a stable rate
    )
    assert [r.concurrency for r in results] == [2], output
    assert results[0].throughput > 0, output
    assert "error" not in output.lower(), output


def test_the_container_stops_clean(worker: Worker) -> None:
    worker.container.stop(timeout=30)
    worker.container.reload()
    assert worker.container.attrs["State"]["ExitCode"] == 0, worker.container.logs()[-3000:]
