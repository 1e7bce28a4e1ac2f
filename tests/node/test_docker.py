"""``hloserve node up|down`` with the docker runtime on a real Docker daemon.

One node for the module: ``hloserve node up`` (a subprocess, as users run it) with two CPU
worker containers of the image built from containers/worker-cpu.Dockerfile (once per session,
tests/node/docker_image.py: nothing is pulled) serving the digits repository, and the gateway
in front. The tests check the answers through
the gateway, the containers as Docker sees them, a worker killed under load being restarted by
Docker while traffic recovers, and ``hloserve node down`` leaving no container. Without a
daemon the module is skipped, unless ``HLOSERVE_REQUIRE_DOCKER=1`` (CI) makes that a failure.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
import yaml

from hloserve.errors import NodeError, Status
from hloserve.model_repository_tools.build import build_repository
from hloserve.ports import free_ports
from tests.node.docker_image import IMAGE_UID, MEMLOCK, ensure_images
from tests.node.node_testing import (
    HLOSERVE,
    LoadLoop,
    NodeProcess,
    contiguous_free_ports,
    infer_digits,
    ready,
    successes,
    two_worker_ports,
)

# the node's own bounds: image build, then up to STARTUP_S + 30 s for `node up` (first test)
pytestmark = [
    pytest.mark.docker,
    pytest.mark.tritonserver,
    pytest.mark.slow,
    pytest.mark.timeout(900),
]

docker = pytest.importorskip("docker")
grpcclient = pytest.importorskip("tritonclient.grpc")

STARTUP_S = 300.0


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    from hloserve.node.docker_runtime import connect

    try:
        daemon = connect()
    except NodeError as exc:
        reason = f"{exc} (scripts/docker.sh starts one as root)"
        if os.environ.get("HLOSERVE_REQUIRE_DOCKER") == "1":
            pytest.fail(f"HLOSERVE_REQUIRE_DOCKER=1 but {reason}")
        pytest.skip(reason)
    yield daemon
    daemon.close()


@pytest.fixture(scope="module")
def node(
    client: Any, digits_bundle: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NodeProcess]:
    image = ensure_images().worker_cpu
    work = tmp_path_factory.mktemp("docker_node")
    (work / "bundles").mkdir()
    os.symlink(digits_bundle, work / "bundles" / "digits")
    build_repository(work / "bundles", work / "repository")
    gateway_port, http_port, admin_port = free_ports(3)
    admin_base = contiguous_free_ports(2)
    name = f"hlotest{os.getpid()}"
    settings = {
        "name": name,
        "runtime": "docker",
        "repository": str(work / "repository"),
        "cpu_workers": 2,
        # admin_base: each container's `hloserve serve` admin port (status --models)
        "ports": {**two_worker_ports(contiguous_free_ports(6)), "admin_base": admin_base},
        "restart": {"policy": "on-failure", "max_retries": 3},
        "tritonserver": {"startup_timeout_s": STARTUP_S},
        "docker": {
            "image": image,
            "launcher": "hloserve",
            "stop_timeout_s": 10,
            # memlock: -1 (the default) needs a daemon allowed to raise the hard limit
            "ulimits": {"memlock": MEMLOCK, "stack": 67108864},
        },
        "gateway": {
            "listen": f"127.0.0.1:{gateway_port}",
            "http_listen": f"127.0.0.1:{http_port}",
            "admin_port": admin_port,
            "settings": {"discovery": {"poll_interval_seconds": 1}},
        },
    }
    handle: NodeProcess | None = None
    try:
        handle = NodeProcess(settings, work, STARTUP_S + 30)
        handle.name = name  # type: ignore[attr-defined]
        yield handle
    finally:
        if handle is not None:
            handle.stop()
        for container in client.containers.list(
            all=True, filters={"label": f"hloserve.node={name}"}
        ):
            container.remove(force=True)


@pytest.fixture(scope="module")
def test_split(digits_model: Any, digits_params: Any) -> tuple[np.ndarray, np.ndarray]:
    _, _, x, _ = digits_model.load_split()
    return x, np.asarray(jax.jit(digits_model.apply)(digits_params, x))


def containers(client: Any, node: NodeProcess) -> list[Any]:
    found = client.containers.list(all=True, filters={"label": f"hloserve.node={node.name}"})
    return sorted(found, key=lambda c: c.labels["hloserve.worker"])


def test_two_cpu_worker_containers_serve_digits_through_the_gateway(
    client: Any, node: NodeProcess, test_split: Any
) -> None:
    found = containers(client, node)
    assert [c.name for c in found] == [f"hloserve-{node.name}-worker{i}" for i in (0, 1)]
    assert all(c.status == "running" for c in found)
    images, reference = test_split
    gateway = grpcclient.InferenceServerClient(node.gateway)
    for start in range(0, 64, 8):
        logits = infer_digits(gateway, images[start : start + 8])
        np.testing.assert_allclose(logits, reference[start : start + 8], rtol=1e-5, atol=1e-5)
    # round robin over both containers (Triton's success count lags the answer: poll, bounded)
    for _ in range(100):
        if all(successes(url) > 0 for url in node.worker_grpc):
            break
        time.sleep(0.1)
    assert all(successes(url) > 0 for url in node.worker_grpc)
    assert "[worker 0]" in node.log_text() and "[worker 1]" in node.log_text()


def test_system_shared_memory_reaches_the_worker_containers(
    node: NodeProcess, test_split: Any
) -> None:
    """``docker.ipc: host``: a region the client creates on the host, registered through the
    gateway (fanned out to both containers), carries the input and output of requests that
    either container answers, as direct calls do."""
    from multiprocessing import shared_memory

    images, reference = test_split
    batch = np.ascontiguousarray(images[:4])
    sizes = {"in": batch.nbytes, "out": reference[:4].nbytes}
    regions = {
        n: shared_memory.SharedMemory(f"hloserve-node-{os.getpid()}-{n}", create=True, size=size)
        for n, size in sizes.items()
    }
    gateway = grpcclient.InferenceServerClient(node.gateway)
    for region in regions.values():  # the workers run as the image's user (UID 10001)
        os.chmod(f"/dev/shm/{region.name}", 0o666)
    try:
        np.ndarray(batch.shape, np.float32, buffer=regions["in"].buf)[:] = batch
        for n, region in regions.items():  # POSIX key: "/" + the name in /dev/shm
            gateway.register_system_shared_memory(f"node_{n}", f"/{region.name}", sizes[n])
        for url in node.worker_grpc:  # fanned out: every container registered both
            status = grpcclient.InferenceServerClient(url).get_system_shared_memory_status()
            assert {"node_in", "node_out"} <= set(status.regions)
        for _ in range(4):  # round robin over both containers
            tensor = grpcclient.InferInput("image", list(batch.shape), "FP32")
            tensor.set_shared_memory("node_in", sizes["in"])
            output = grpcclient.InferRequestedOutput("logits")
            output.set_shared_memory("node_out", sizes["out"])
            gateway.infer("digits", [tensor], outputs=[output], client_timeout=30)
            logits = np.ndarray(reference[:4].shape, np.float32, buffer=regions["out"].buf)
            np.testing.assert_allclose(logits, reference[:4], rtol=1e-5, atol=1e-5)
        gateway.unregister_system_shared_memory()
    finally:
        for region in regions.values():
            region.close()
            region.unlink()


def test_containers_are_what_the_node_file_asked_for(client: Any, node: NodeProcess) -> None:
    host_config = containers(client, node)[1].attrs["HostConfig"]
    assert host_config["NetworkMode"] == "host"
    assert host_config["IpcMode"] == "host"  # docker.ipc's default: clients' shm regions
    assert host_config["RestartPolicy"] == {"Name": "on-failure", "MaximumRetryCount": 3}
    assert {u["Name"]: u["Soft"] for u in host_config["Ulimits"]} == {
        "memlock": MEMLOCK,
        "stack": 67108864,
    }
    assert any(b.endswith(":/models:ro") for b in host_config["Binds"])
    assert host_config["Init"] is True


def test_workers_run_as_the_images_user_with_a_healthcheck(client: Any, node: NodeProcess) -> None:
    worker = containers(client, node)[0]
    assert worker.attrs["Config"]["User"] == "hloserve"
    code, out = worker.exec_run(["id", "-u"])
    assert (code, out.decode().strip()) == (0, str(IMAGE_UID))
    for _ in range(60):  # Docker runs the image's HEALTHCHECK every 5 s
        worker.reload()
        if worker.attrs["State"]["Health"]["Status"] == "healthy":
            break
        time.sleep(1)
    assert worker.attrs["State"]["Health"]["Status"] == "healthy", worker.attrs["State"]


def test_each_worker_container_has_its_own_admin_port(client: Any, node: NodeProcess) -> None:
    """With host networking every container's `hloserve serve` binds ``ports.admin_base + i``:
    both answer `hloserve status --models` (one shared default would leave the second off)."""
    from hloserve.node.status import fetch_models

    base = yaml.safe_load(node.config.read_text())["ports"]["admin_base"]
    for i, container in enumerate(containers(client, node)):
        assert f"--admin-port={base + i}" in container.attrs["Config"]["Cmd"]
        rows = fetch_models(f"127.0.0.1:{base + i}")
        assert {r["name"]: r["state"] for r in rows}.get("digits") == "READY", rows
        status = subprocess.run(
            [HLOSERVE, "status", "--models", f"127.0.0.1:{base + i}"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert status.returncode == 0, status.stderr
        assert "digits" in status.stdout and "READY" in status.stdout, status.stdout
    taken = [ln for ln in node.log_text().splitlines() if "[worker" in ln and "is taken" in ln]
    assert taken == []


def test_missing_image_is_a_clear_error(client: Any, node: NodeProcess) -> None:
    from hloserve.node.docker_runtime import DockerWorkers
    from hloserve.node.node_config import load_node_config
    from hloserve.node.plan import plan_workers

    config = load_node_config(node.config, environ={})
    config = config.model_copy(
        update={
            "name": "hlomissing",
            "docker": config.docker.model_copy(update={"image": "hloserve-missing:0"}),
        }
    )
    with pytest.raises(NodeError, match="docker image 'hloserve-missing:0' is not present") as info:
        DockerWorkers(config, plan_workers(config)).start()
    assert info.value.status is Status.NOT_FOUND
    # the documented build line, as worker-cpu.Dockerfile's header writes it
    build = "docker build --network=host -f containers/worker-cpu.Dockerfile -t hloserve-missing:0"
    assert f"build it ({build} .)" in str(info.value)
    # the default image of the hloserve launcher on CPU workers is what scripts/images.sh cpu
    # builds, and the hint names that command
    config = config.model_copy(
        update={
            "name": "hlomissing",
            "docker": config.docker.model_copy(update={"image": "hloserve-worker-cpu:nosuchtag"}),
        }
    )
    with pytest.raises(NodeError, match=r"TAG=nosuchtag bash scripts/images\.sh cpu, or docker"):
        DockerWorkers(config, plan_workers(config)).start()


def test_killed_worker_is_restarted_and_traffic_recovers(
    client: Any, node: NodeProcess, test_split: Any
) -> None:
    images, reference = test_split
    worker = containers(client, node)[0]
    restarts_before = worker.attrs["RestartCount"]
    load = LoadLoop(node.gateway, images, reference)
    try:
        load.wait_count(20, 60)
        os.kill(worker.attrs["State"]["Pid"], signal.SIGKILL)  # a crash, not a docker stop
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            worker.reload()
            if worker.attrs["RestartCount"] > restarts_before and ready(node.worker_http[0]):
                break
            time.sleep(0.5)
        assert worker.attrs["RestartCount"] == restarts_before + 1, node.log_text()[-3000:]
        load.wait_for_traffic_to(node.worker_grpc[0])
    finally:
        results = load.stop()
    assert len(results[-20:]) == 20 and all(results[-20:]), f"last answers {results[-20:]}"
    assert "restarted by Docker" in node.log_text()


def test_node_down_removes_every_container(client: Any, node: NodeProcess) -> None:
    down = node.down()
    assert down.returncode == 0, down.stderr
    assert f"hloserve-{node.name}-worker0" in down.stdout
    assert containers(client, node) == []
    assert node.process.wait(timeout=60) == 0
    assert f"hloserve node {node.name}: stopped" in node.log_text()


def test_ctrl_c_while_starting_removes_the_containers(
    client: Any, node: NodeProcess, tmp_path: Path
) -> None:
    settings = yaml.safe_load(node.config.read_text())
    name = f"{settings['name']}c"
    ports = {**two_worker_ports(contiguous_free_ports(3)), "admin_base": 0}  # 0: a free port
    settings.update(name=name, cpu_workers=1, ports=ports)
    config = tmp_path / "node.yaml"
    config.write_text(yaml.safe_dump(settings))
    log = tmp_path / "node.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [HLOSERVE, "node", "up", "--config", str(config)], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        for _ in range(600):  # the container exists; the worker is still starting
            if f"hloserve-{name}-worker0" in log.read_text() or process.poll() is not None:
                break
            time.sleep(0.1)
        assert f"container hloserve-{name}-worker0" in log.read_text(), log.read_text()
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=90) == 0, log.read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert client.containers.list(all=True, filters={"label": f"hloserve.node={name}"}) == []
    assert f"hloserve node {name}: stopped" in log.read_text()
