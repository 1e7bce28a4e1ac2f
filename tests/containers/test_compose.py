"""containers/compose.yaml on this CPU host with Debian's docker-compose 1.29.

One project for the module: two CPU workers and the gateway of the images the session built
(``--no-build``: tests/node/docker_image.py built them from the same Dockerfiles), serving
digits on free ports. tritonclient (gRPC and HTTP) and perf_analyzer talk to the gateway;
``down -v`` leaves
no container and no volume. The Prometheus/Grafana services stay behind their profile.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from hloserve.model_repository_tools.build import build_repository
from hloserve.ports import free_ports
from tests.containers.conftest import world_readable
from tests.node.docker_image import IMAGE_UID, MEMLOCK, ROOT, Images
from tests.node.node_testing import contiguous_free_ports, infer_digits, ready

pytestmark = [
    pytest.mark.docker,
    pytest.mark.tritonserver,
    pytest.mark.slow,
    pytest.mark.timeout(900),
]

grpcclient = pytest.importorskip("tritonclient.grpc")
COMPOSE = shutil.which("docker-compose")
STARTUP_S = 300.0


class Project:
    def __init__(self, name: str, env: dict[str, str]) -> None:
        self.name, self.env = name, env
        self.gateway = env["HLOSERVE_GATEWAY_LISTEN"]
        self.gateway_http = env["HLOSERVE_GATEWAY_HTTP_LISTEN"]
        self.worker_http = [f"127.0.0.1:{env[f'HLOSERVE_W{i}_HTTP']}" for i in (0, 1)]

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        assert COMPOSE is not None
        return subprocess.run(
            [COMPOSE, "-p", self.name, "-f", str(ROOT / "containers" / "compose.yaml"), *args],
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def logs(self) -> str:
        return self.compose("logs", "--no-color", "--tail=60").stdout[-4000:]


@pytest.fixture(scope="module")
def project(
    docker_client: Any,
    images: Images,
    digits_bundle: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Project]:
    if COMPOSE is None:
        pytest.fail("docker-compose is missing (apt-get install docker-compose)")
    work = tmp_path_factory.mktemp("compose")
    (work / "bundles").mkdir()
    os.symlink(digits_bundle, work / "bundles" / "digits")
    build_repository(work / "bundles", work / "repository")
    world_readable(work / "repository")
    base = contiguous_free_ports(6)
    gateway, gateway_http, admin = free_ports(3)
    env = {
        "HLOSERVE_REPOSITORY": str(work / "repository"),
        "HLOSERVE_MEMLOCK": str(MEMLOCK),
        "HLOSERVE_MODEL_CONTROL_KEY": f"hlotest{os.getpid()}compose",
    }
    for i in (0, 1):
        for j, kind in enumerate(("HTTP", "GRPC", "METRICS")):
            env[f"HLOSERVE_W{i}_{kind}"] = str(base + 3 * i + j)
    env["HLOSERVE_GATEWAY_LISTEN"] = f"127.0.0.1:{gateway}"
    env["HLOSERVE_GATEWAY_HTTP_LISTEN"] = f"127.0.0.1:{gateway_http}"
    env["HLOSERVE_GATEWAY_ADMIN_PORT"] = str(admin)
    handle = Project(f"hlotest{os.getpid()}", env)
    try:
        up = handle.compose("up", "-d", "--no-build")
        assert up.returncode == 0, up.stderr

        # each worker's `hloserve serve` loads digits once Triton answers ready: wait for it
        def digits_ready() -> bool:
            return all(ready(w, "digits") for w in handle.worker_http)

        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline and not digits_ready():
            time.sleep(1)
        assert digits_ready(), handle.logs()
        yield handle
    finally:
        handle.compose("down", "-v", "--timeout", "30")


def project_containers(client: Any, project: Project) -> list[Any]:
    found = client.containers.list(
        all=True, filters={"label": f"com.docker.compose.project={project.name}"}
    )
    return sorted(found, key=lambda c: c.name)


def test_compose_runs_the_cpu_node_without_the_observability_profile(
    docker_client: Any, project: Project, images: Images
) -> None:
    found = project_containers(docker_client, project)
    services = {c.labels["com.docker.compose.service"]: c for c in found}
    assert sorted(services) == ["gateway", "worker0", "worker1"]
    assert all(c.status == "running" for c in found)
    # scripts/images.sh tags each image `latest` (what compose names) and hloserve's version
    assert images.gateway in services["gateway"].image.tags
    assert images.worker_cpu in services["worker0"].image.tags
    # gateway.Dockerfile: KServe HTTP 8000, gRPC 8001, admin 8002
    exposed = services["gateway"].image.attrs["Config"]["ExposedPorts"]
    assert sorted(exposed) == ["8000/tcp", "8001/tcp", "8002/tcp"]
    code, out = services["gateway"].exec_run(["id", "-u"])
    assert (code, out.decode().strip()) == (0, str(IMAGE_UID))
    # the workers share the named executable cache volume, owned by the image's user
    mounts = {m["Destination"]: m for m in services["worker1"].attrs["Mounts"]}
    cache = mounts["/var/cache/hloserve/executables"]
    assert cache["Type"] == "volume" and cache["Name"] == f"{project.name}_hloserve-executables"
    code, out = services["worker1"].exec_run(["stat", "-c", "%u", cache["Destination"]])
    assert (code, out.decode().strip()) == (0, str(IMAGE_UID))


def model_ready(client: Any) -> bool:
    from tritonclient.utils import InferenceServerException

    try:
        return bool(client.is_model_ready("digits"))
    except InferenceServerException:  # the gateway does not listen yet
        return False


def test_tritonclient_through_the_gateway(
    project: Project, digits_model: Any, digits_params: Any
) -> None:
    _, _, x, _ = digits_model.load_split()
    reference = np.asarray(jax.jit(digits_model.apply)(digits_params, x[:32]))
    client = grpcclient.InferenceServerClient(project.gateway)
    deadline = time.monotonic() + 60  # the gateway starts and discovers the workers
    while not model_ready(client) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert model_ready(client), project.logs()
    for start in range(0, 32, 8):
        logits = infer_digits(client, x[start : start + 8])
        np.testing.assert_allclose(logits, reference[start : start + 8], rtol=1e-5, atol=1e-5)


def test_kserve_http_through_the_gateway(
    project: Project, digits_model: Any, digits_params: Any
) -> None:
    """compose's gateway serves KServe V2 HTTP (HLOSERVE_GATEWAY_HTTP_LISTEN, 8000 by
    default) over the workers' HTTP ports, as `node up` does."""
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    _, _, x, _ = digits_model.load_split()
    reference = np.asarray(jax.jit(digits_model.apply)(digits_params, x[:16]))
    client = httpclient.InferenceServerClient(project.gateway_http)

    def http_model_ready() -> bool:
        try:
            return bool(client.is_model_ready("digits"))
        except (InferenceServerException, OSError):  # the gateway does not listen yet
            return False

    deadline = time.monotonic() + 60  # the gateway starts and discovers the workers
    while not http_model_ready() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert http_model_ready(), project.logs()
    assert client.is_server_ready()
    for start in range(0, 16, 4):  # round robin over both workers
        tensor = httpclient.InferInput("image", [4, *x.shape[1:]], "FP32")
        tensor.set_data_from_numpy(np.ascontiguousarray(x[start : start + 4]))
        logits = client.infer("digits", [tensor]).as_numpy("logits")
        np.testing.assert_allclose(logits, reference[start : start + 4], rtol=1e-5, atol=1e-5)
    with pytest.raises(InferenceServerException, match="nosuchmodel"):
        client.infer("nosuchmodel", [tensor])


def test_perf_analyzer_through_the_gateway_has_zero_errors(project: Project) -> None:
    from hloserve.node.perf_analyzer import run_perf_analyzer

    results, output = run_perf_analyzer(
        "digits",
        project.gateway,
        concurrency=(2,),
        request_count=200,  # answers and errors are the point, not a stable rate
    )
    assert [r.concurrency for r in results] == [2], output
    assert results[0].throughput > 0, output
    assert "error" not in output.lower(), output


def test_the_workers_turn_healthy(docker_client: Any, project: Project) -> None:
    workers = [c for c in project_containers(docker_client, project) if "worker" in c.name]
    for _ in range(60):  # the image's HEALTHCHECK runs every 5 s
        for c in workers:
            c.reload()
        if all(c.attrs["State"]["Health"]["Status"] == "healthy" for c in workers):
            break
        time.sleep(1)
    assert [c.attrs["State"]["Health"]["Status"] for c in workers] == ["healthy"] * 2


def test_stop_then_down_is_clean(docker_client: Any, project: Project) -> None:
    stop = project.compose("stop", "--timeout", "30")
    assert stop.returncode == 0, stop.stderr
    found = project_containers(docker_client, project)
    codes = {c.labels["com.docker.compose.service"]: c.attrs["State"]["ExitCode"] for c in found}
    assert codes == {"gateway": 0, "worker0": 0, "worker1": 0}, project.logs()
    down = project.compose("down", "-v", "--timeout", "30")
    assert down.returncode == 0, down.stderr
    assert project_containers(docker_client, project) == []
    assert docker_client.volumes.list(filters={"name": f"{project.name}_"}) == []
