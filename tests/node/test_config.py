"""The node file, the worker plan and the container spec, without Docker or tritonserver.

The golden test pins what ``hloserve node up`` sends to Docker for a four-GPU node: the
device request of exactly one GPU per container, host networking, the read-only repository,
``/dev/shm``, the ulimits, the restart policy, labels, environment and tritonserver flags.
"""

from __future__ import annotations

import importlib.util
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from hloserve.errors import InvalidArgumentError, NodeConfigError, PortInUseError, Status
from hloserve.node.docker_spec import (
    container_spec,
    image_build_command,
    image_build_hint,
    loads_when_ready,
    to_sdk,
    worker_image,
)
from hloserve.node.node import run_node_up
from hloserve.node.node_config import NodeConfig, load_node_config
from hloserve.node.plan import (
    GpuNotFoundError,
    WorkerPlan,
    gateway_config,
    gateway_enabled,
    plan_workers,
    planned_ports,
    runtime_allocator_env,
    worker_env,
)
from tests.conftest import needs_tritonclient

GPU_NODE = """
name: gpunode
runtime: docker
repository: /srv/models
host: 0.0.0.0
gpus: all
docker:
  image: registry.example/hloserve-worker:24.12
  ipc: private
  shm_size: 2g
  env: {HLOSERVE_LOG: info}
  mounts: [/srv/cache:/cache:rw]
restart: {policy: on-failure, max_retries: 3}
tritonserver:
  args: ["--backend-config=python,shm-default-byte-size=16777216"]  # quoted: a comma
gateway:
  listen: 0.0.0.0:8001
  settings: {mode: least_outstanding}
"""

#: containers.run keyword arguments of worker 2 (GPU 2) of GPU_NODE.
GOLDEN_WORKER_2 = {
    "image": "registry.example/hloserve-worker:24.12",
    "name": "hloserve-gpunode-worker2",
    "command": [
        "tritonserver",
        "--model-repository=/models",
        "--backend-directory=/opt/tritonserver/backends",
        "--model-control-mode=explicit",
        "--load-model=hloserve_runtime",  # the rest once ready: loads_when_ready
        "--http-address=0.0.0.0",
        "--http-port=8106",
        "--grpc-address=0.0.0.0",
        "--grpc-port=8107",
        "--metrics-address=0.0.0.0",
        "--metrics-port=8108",
        "--log-verbose=0",
        "--exit-on-error=false",
        "--strict-readiness=false",
        "--backend-config=python,shm-default-byte-size=16777216",
        "--backend-config=python,shm-region-prefix-name=hloserve-gpunode-w2-",
    ],
    "labels": {"hloserve.node": "gpunode", "hloserve.worker": "2", "hloserve.gpu": "2"},
    "environment": {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        # the runtime's allocator (no runtime model at /srv/models here: the default fraction)
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "XLA_CLIENT_MEM_FRACTION": "0.9",
        "HLOSERVE_LOG": "info",
    },
    "network_mode": "host",
    "ipc_mode": "private",
    "shm_size": "2g",
    "volumes": {
        "/srv/models": {"bind": "/models", "mode": "ro"},
        "/srv/cache": {"bind": "/cache", "mode": "rw"},
    },
    "ulimits": [
        {"name": "memlock", "soft": -1, "hard": -1},
        {"name": "stack", "soft": 67108864, "hard": 67108864},
    ],
    "device_requests": [{"driver": "nvidia", "device_ids": ["2"], "capabilities": [["gpu"]]}],
    "restart_policy": {"Name": "on-failure", "MaximumRetryCount": 3},
    "init": True,
    "detach": True,
}


@pytest.fixture
def gpu_node(tmp_path: Path) -> NodeConfig:
    path = tmp_path / "node.yaml"
    path.write_text(GPU_NODE)
    return load_node_config(path, environ={})


def test_worker_containers_share_the_hosts_ipc_namespace_by_default(tmp_path: Path) -> None:
    """``docker.ipc: host`` (default): clients' system shared-memory regions are visible to
    the workers; no private ``/dev/shm`` size; each worker's Python backend regions get their
    own prefix (they share the host's ``/dev/shm``), unless the user's args set one."""
    node = NodeConfig.model_validate(
        {"name": "n", "runtime": "docker", "repository": tmp_path, "cpu_workers": 2}
    )
    specs = [container_spec(node, w) for w in plan_workers(node)]
    assert [s["ipc_mode"] for s in specs] == ["host", "host"]
    assert all("shm_size" not in s for s in specs)
    prefixes = [[a for a in s["command"] if "shm-region-prefix-name" in a] for s in specs]
    assert prefixes == [
        ["--backend-config=python,shm-region-prefix-name=hloserve-n-w0-"],
        ["--backend-config=python,shm-region-prefix-name=hloserve-n-w1-"],
    ]
    own = node.model_copy(
        update={
            "tritonserver": node.tritonserver.model_copy(
                update={"args": ("--backend-config=python,shm-region-prefix-name=mine-",)}
            )
        }
    )
    command = container_spec(own, plan_workers(own)[0])["command"]
    assert [a for a in command if "shm-region-prefix-name" in a] == [
        "--backend-config=python,shm-region-prefix-name=mine-"
    ]
    with pytest.raises(ValidationError, match=r"docker\.ipc"):
        NodeConfig.model_validate({"repository": tmp_path, "docker": {"ipc": "shareable"}})


def test_gpu_node_container_spec_matches_golden(gpu_node: NodeConfig) -> None:
    plan = plan_workers(gpu_node, available_gpus=(0, 1, 2, 3))
    assert [(w.index, w.gpu, w.grpc_port) for w in plan] == [
        (0, 0, 8101),
        (1, 1, 8104),
        (2, 2, 8107),
        (3, 3, 8110),
    ]
    assert container_spec(gpu_node, plan[2]) == GOLDEN_WORKER_2
    assert loads_when_ready(gpu_node, plan[2]) == ("*",)  # every model after the runtime
    for worker in plan:  # one GPU per container, each a different one
        requests = container_spec(gpu_node, worker)["device_requests"]
        assert requests[0]["device_ids"] == [str(worker.gpu)]


def test_cpu_worker_spec_has_no_device_request_and_hides_gpus(tmp_path: Path) -> None:
    config = NodeConfig(repository=tmp_path, runtime="docker", cpu_workers=2)
    spec = container_spec(config, plan_workers(config)[1])
    assert spec["device_requests"] == []
    assert spec["environment"] == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "",
        "JAX_PLATFORMS": "cpu",
    }
    assert spec["restart_policy"] == {"Name": "on-failure", "MaximumRetryCount": 5}


def test_hloserve_launcher_runs_hloserve_serve_on_the_mount(tmp_path: Path) -> None:
    config = NodeConfig.model_validate(
        {
            "repository": tmp_path,
            "runtime": "docker",
            "cpu_workers": 2,
            "docker": {"launcher": "hloserve"},
            "tritonserver": {"args": ["--log-info=false"], "startup_timeout_s": 90},
        }
    )
    first, second = (container_spec(config, w)["command"] for w in plan_workers(config))
    assert first == [
        "hloserve",
        "serve",
        "/models",
        "--host=127.0.0.1",
        "--http-port=8100",
        "--grpc-port=8101",
        "--metrics-port=8102",
        "--model-control-mode=explicit",
        "--load-model=*",
        "--log-verbose=0",
        "--startup-timeout=90",
        "--admin-port=8004",  # ports.admin_base + i: each container's serve its own
        "--",
        "--log-info=false",
    ]
    assert [a for a in second if a.startswith(("--http-port", "--admin-port"))] == [
        "--http-port=8103",
        "--admin-port=8005",
    ]
    ports = planned_ports(config, plan_workers(config))
    assert ports["worker 1 admin"] == ("127.0.0.1", 8005)
    # admin_base 0: a free port each, nothing to check before the start
    free = config.model_copy(update={"ports": config.ports.model_copy(update={"admin_base": 0})})
    assert "--admin-port=0" in container_spec(free, plan_workers(free)[1])["command"]
    assert not any(
        k.endswith(" admin") and k.startswith("worker")
        for k in planned_ports(free, plan_workers(free))
    )
    clash = config.model_copy(
        update={"ports": config.ports.model_copy(update={"admin_base": 8104})}
    )
    clashing = "worker 1 grpc and worker 0 admin both use port 8104"
    with pytest.raises(NodeConfigError, match=clashing):
        planned_ports(clash, plan_workers(clash))


@pytest.mark.parametrize("launcher", ["tritonserver", "hloserve"])
def test_explicit_load_of_a_meta_loads_what_it_calls_in_a_container(
    tmp_path: Path, launcher: str
) -> None:
    """The tritonserver launcher loads a meta's callees (transitively) and the runtime model,
    as ``hloserve serve`` does, the runtime model first; the hloserve launcher hands the names
    to ``hloserve serve``, which adds them inside the container from the same mounted
    repository."""
    if launcher == "tritonserver":
        pytest.importorskip("tritonclient.grpc.model_config_pb2")  # reads config.pbtxt
    calls = {"cascade": "fast,outer", "outer": "slow,fast"}  # a meta calling a meta
    for name in ("cascade", "outer", "fast", "slow", "unrelated", "hloserve_runtime"):
        (tmp_path / name).mkdir()
        text = f'name: "{name}"\n'
        if name in calls:
            value = f'value {{ string_value: "{calls[name]}" }}'
            text += f'parameters {{ key: "hloserve.meta_calls" {value} }}\n'
        (tmp_path / name / "config.pbtxt").write_text(text)
    config = NodeConfig.model_validate(
        {
            "repository": tmp_path,
            "runtime": "docker",
            "cpu_workers": 1,
            "docker": {"launcher": launcher},
            "tritonserver": {"model_control_mode": "explicit", "load_models": ["cascade"]},
        }
    )
    command = container_spec(config, plan_workers(config)[0])["command"]
    loads = [a.removeprefix("--load-model=") for a in command if a.startswith("--load-model=")]
    if launcher == "tritonserver":  # the runtime at start, the rest once ready
        assert loads == ["hloserve_runtime"]
        later = loads_when_ready(config, plan_workers(config)[0])
        assert later == ("cascade", "fast", "outer", "slow")
    else:
        assert loads_when_ready(config, plan_workers(config)[0]) == ()
        assert loads == ["cascade"]
        assert command[:3] == ["hloserve", "serve", "/models"]


@pytest.mark.skipif(importlib.util.find_spec("docker") is None, reason="docker SDK not installed")
def test_to_sdk_builds_the_sdk_types(gpu_node: NodeConfig) -> None:
    from docker.types import DeviceRequest, Ulimit

    kwargs = to_sdk(container_spec(gpu_node, plan_workers(gpu_node, (0,))[0]))
    (request,) = kwargs["device_requests"]
    assert isinstance(request, DeviceRequest)
    assert request == {
        "Driver": "nvidia",
        "Count": 0,
        "DeviceIDs": ["0"],
        "Capabilities": [["gpu"]],
        "Options": {},
    }
    assert all(isinstance(u, Ulimit) for u in kwargs["ulimits"])
    assert kwargs["ulimits"][0] == {"Name": "memlock", "Soft": -1, "Hard": -1}


def test_gpu_asked_for_but_none_present(gpu_node: NodeConfig) -> None:
    with pytest.raises(
        GpuNotFoundError, match=r"node .*: --gpus all: GPU asked for but none is visible"
    ):
        plan_workers(gpu_node, available_gpus=())
    listed = gpu_node.model_copy(update={"gpus": (0, 5)})
    with pytest.raises(GpuNotFoundError, match="GPU 5 asked for but the visible GPUs are 0,1"):
        plan_workers(listed, available_gpus=(0, 1))
    assert GpuNotFoundError("x").status is Status.FAILED_PRECONDITION


def test_process_workers_see_only_their_gpu() -> None:
    assert worker_env(WorkerPlan(1, 3, 1, 2, 3), docker=False) == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "3",
    }
    assert worker_env(WorkerPlan(1, 3, 1, 2, 3), docker=True) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def _runtime_config(repository: Path, parameters: str) -> None:
    model = repository / "hloserve_runtime"
    model.mkdir(parents=True)
    (model / "config.pbtxt").write_text(
        f'name: "hloserve_runtime"\nbackend: "hloserve_runtime"\n{parameters}'
    )


@needs_tritonclient
def test_gpu_workers_carry_the_runtimes_allocator_settings(tmp_path: Path) -> None:
    """The launcher sets JAX's allocator from the runtime model's device memory fraction, so
    the runtime's environment (``/proc/<pid>/environ``) holds it; CPU workers get none."""
    _runtime_config(
        tmp_path,
        'parameters { key: "hloserve.device_memory_fraction" value { string_value: "0.7" } }\n',
    )
    allocator = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_CLIENT_MEM_FRACTION": "0.7"}
    gpu, cpu = WorkerPlan(0, 1, 1, 2, 3), WorkerPlan(1, None, 4, 5, 6)
    assert worker_env(gpu, docker=False, repository=tmp_path) == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "1",
        **allocator,
    }
    assert worker_env(gpu, docker=True, repository=tmp_path) == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        **allocator,
    }
    assert "XLA_CLIENT_MEM_FRACTION" not in worker_env(cpu, docker=False, repository=tmp_path)


@needs_tritonclient
def test_a_malformed_device_memory_fraction_is_refused_before_launch(tmp_path: Path) -> None:
    _runtime_config(
        tmp_path,
        'parameters { key: "hloserve.device_memory_fraction" value { string_value: "1.5" } }\n',
    )
    with pytest.raises(
        InvalidArgumentError,
        match=r"model 'hloserve_runtime': parameter 'hloserve.device_memory_fraction' must be "
        r"a number in \(0, 1\], got '1.5'",
    ):
        runtime_allocator_env(tmp_path)


def test_env_overrides_use_the_gateway_scheme(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text("repository: repo\ncpu_workers: 1\n")
    config = load_node_config(
        path,
        environ={
            "HLOSERVE_NODE_RUNTIME": "docker",
            "HLOSERVE_NODE_CPU_WORKERS": "0",
            "HLOSERVE_NODE_GPUS": "0,2",
            "HLOSERVE_NODE_DOCKER__IMAGE": "img:1",
            "HLOSERVE_NODE_DOCKER__ENV": "{A: b}",
            "HLOSERVE_NODE_RESTART__POLICY": "always",
            "HLOSERVE_NODE_PORTS__HTTP_BASE": "9000",
            "HLOSERVE_NODE_PORTS__STRIDE": "1000",
            "OTHER": "ignored",
        },
    )
    assert config.repository == tmp_path / "repo"  # relative to the file
    assert (config.runtime, config.gpus, config.docker.image) == ("docker", (0, 2), "img:1")
    assert config.docker.env == {"A": "b"}
    assert config.restart.policy == "always"
    assert config.ports.of_worker(1) == (10000, 9101, 9102)
    assert (
        load_node_config(
            path, environ={"HLOSERVE_NODE_GPUS": "all", "HLOSERVE_NODE_CPU_WORKERS": "0"}
        ).gpus
        == "all"
    )


@pytest.mark.parametrize(
    ("environ", "text", "words"),
    [
        (
            {"HLOSERVE_NODE_DOCKR__IMAGE": "x"},
            "repository: r\ncpu_workers: 1\n",
            ["DOCKR", "names no setting"],
        ),
        ({"HLOSERVE_NODE_DOCKER": "x"}, "repository: r\ncpu_workers: 1\n", ["is a section"]),
        ({}, "cpu_workers: 1\n", ["repository: required key is missing"]),
        ({}, "repository: r\n", ["no workers"]),
        ({}, "repository: r\ncpu_workers: 1\ngpus: all\n", ["not both"]),
        ({}, "repository: r\ngpus: [0, 0]\n", ["gpus", "distinct"]),
        ({}, "repository: r\ngpus: 'a,b'\n", ["gpus", "'all' or GPU indices"]),
        ({}, "repository: r\ncpu_workers: 1\nports: {stride: 2}\n", ["ports", "stride 2"]),
        ({}, "repository: r\ncpu_workers: 1\ndocker: {shm_size: lots}\n", ["docker.shm_size"]),
        ({}, "repository: r\ncpu_workers: 1\ndocker: {mounts: [a:b]}\n", ["absolute"]),
        ({}, "repository: r\ncpu_workers: 1\nrestart: {policy: sometimes}\n", ["restart.policy"]),
        ({}, "repository: r\ncpu_workers: 1\nname: 'a b'\n", ["name"]),
        (
            {},
            "repository: r\ncpu_workers: 1\ngateway: {settings: {workers: [x:1]}}\n",
            ["set by the node"],
        ),
        ({}, "repository: r\ncpu_workers: 1\nbogus: 1\n", ["bogus: unknown key"]),
        ({}, "- a list\n", ["expected a mapping"]),
    ],
)
def test_bad_node_files_name_the_key(
    tmp_path: Path, environ: dict[str, str], text: str, words: list[str]
) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(text)
    with pytest.raises(NodeConfigError) as info:
        load_node_config(path, environ=environ)
    for word in words:
        assert word in str(info.value)
    assert info.value.status is Status.INVALID_ARGUMENT


def test_gateway_runs_for_two_or_more_workers(tmp_path: Path) -> None:
    one = NodeConfig(repository=tmp_path, cpu_workers=1)
    two = NodeConfig(repository=tmp_path, cpu_workers=2, host="0.0.0.0")
    assert not gateway_enabled(one, 1)
    assert gateway_enabled(two, 2)
    forced = one.model_copy(update={"gateway": one.gateway.model_copy(update={"enabled": True})})
    assert gateway_enabled(forced, 1)
    gw = gateway_config(two, plan_workers(two))
    assert gw.workers == ("127.0.0.1:8101", "127.0.0.1:8104")
    assert gw.worker_metrics == ("127.0.0.1:8102", "127.0.0.1:8105")
    assert set(planned_ports(two, plan_workers(two))) >= {"gateway grpc", "gateway admin"}


def test_bad_gateway_settings_and_port_clashes_are_config_errors(tmp_path: Path) -> None:
    bad = NodeConfig.model_validate(
        {"repository": tmp_path, "cpu_workers": 2, "gateway": {"settings": {"mode": "fastest"}}}
    )
    with pytest.raises(NodeConfigError, match=r"gateway\.settings: mode"):
        gateway_config(bad, plan_workers(bad))
    clash = NodeConfig.model_validate(
        {"repository": tmp_path, "cpu_workers": 2, "gateway": {"listen": "127.0.0.1:8104"}}
    )
    with pytest.raises(NodeConfigError, match="gateway grpc and worker 1 grpc both use port 8104"):
        planned_ports(clash, plan_workers(clash))


def test_port_in_use_is_reported_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        config = NodeConfig.model_validate(
            {
                "repository": tmp_path,
                "cpu_workers": 1,
                "ports": {"http_base": port - 1, "grpc_base": port, "metrics_base": port + 1},
            }
        )
        with pytest.raises(PortInUseError, match=f"worker 0 grpc port 127.0.0.1:{port}"):
            run_node_up(config)


@pytest.mark.parametrize("name", ["node-gpu.yaml", "node-cpu.yaml"])
def test_example_node_files_are_valid(name: str) -> None:
    config = load_node_config(Path(__file__).parents[2] / "containers" / name, environ={})
    plan = plan_workers(config, available_gpus=(0, 1))
    assert len(plan) == 2 and gateway_enabled(config, len(plan))
    gateway_config(config, plan)


@pytest.mark.parametrize(
    ("name", "dockerfile"),
    [("node-gpu.yaml", "worker.Dockerfile"), ("node-cpu.yaml", "worker-cpu.Dockerfile")],
)
def test_missing_image_hint_builds_from_the_images_own_dockerfile(
    name: str, dockerfile: str
) -> None:
    containers = Path(__file__).parents[2] / "containers"
    config = load_node_config(containers / name, environ={})
    hint = image_build_command(config)
    assert hint.startswith("docker build ")
    assert hint.endswith(f" -f containers/{dockerfile} -t {config.docker.image} .")
    # the Dockerfile's own header documents the same line
    assert f"#   {hint}\n" in (containers / dockerfile).read_text()


@pytest.mark.parametrize(
    ("workers", "launcher", "image", "target"),
    [
        ({"gpus": [0]}, None, "hloserve-worker:24.12", None),
        ({"gpus": [0]}, "hloserve", "hloserve-worker-gpu:latest", "gpu"),
        ({"cpu_workers": 2}, "hloserve", "hloserve-worker-cpu:latest", "cpu"),
    ],
)
def test_default_image_is_what_the_documented_build_makes(
    tmp_path: Path, workers: dict[str, Any], launcher: str | None, image: str, target: str | None
) -> None:
    """No ``docker.image``: the launcher's image under the name its documented build gives it
    (worker.Dockerfile's header for the NGC image, scripts/images.sh for the others), and the
    missing-image hint names that build."""
    root = Path(__file__).parents[2]
    docker = {"launcher": launcher} if launcher else {}
    config = NodeConfig.model_validate({"repository": tmp_path, **workers, "docker": docker})
    assert worker_image(config) == image
    assert container_spec(config, plan_workers(config, available_gpus=(0,))[0])["image"] == image
    hint = image_build_hint(config)
    if target is None:  # the NGC image: the Dockerfile's header builds it
        assert f"#   {hint}\n" in (root / "containers" / "worker.Dockerfile").read_text()
        return
    tags = subprocess.run(
        ["bash", "scripts/images.sh", "tags", target],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.split()
    assert image in tags
    dockerfile = f"containers/worker-{target}.Dockerfile"
    assert hint == (
        f"bash scripts/images.sh {target}, or "
        f"docker build --network=host -f {dockerfile} -t {image} ."
    )


@pytest.mark.skipif(importlib.util.find_spec("docker") is None, reason="docker SDK not installed")
def test_no_docker_daemon_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hloserve.errors import NodeError
    from hloserve.node.docker_runtime import connect

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-daemon.sock")
    with pytest.raises(NodeError, match="no Docker daemon answers") as info:
        connect()
    assert info.value.status is Status.UNAVAILABLE


def test_cli_node_reports_errors_and_an_empty_down(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hloserve.cli import main

    path = tmp_path / "node.yaml"
    path.write_text(f"name: clitest\nrepository: {tmp_path}\ngpus: [63]\n")
    assert main(["node", "up", "--config", str(path)]) == 1
    err = capsys.readouterr().err
    assert "error (FAILED_PRECONDITION)" in err and "GPU" in err and "asked for" in err
    assert main(["node", "down", "--config", str(path)]) == 0
    assert capsys.readouterr().out.strip() == "node clitest: nothing was running"
    path.write_text("repository: r\ncpu_workers: 1\nruntime: podman\n")
    assert main(["node", "up", "--config", str(path)]) == 1
    assert "runtime" in capsys.readouterr().err


def test_a_bad_value_from_the_environment_names_its_variable(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text("repository: repo\ncpu_workers: 1\nrestart: {policy: sometimes}\n")
    environ = {"HLOSERVE_NODE_RESTART__MAX_RETRIES": "abc"}
    with pytest.raises(NodeConfigError) as info:
        load_node_config(path, environ=environ)
    message = str(info.value)
    assert "HLOSERVE_NODE_RESTART__MAX_RETRIES (environment, restart.max_retries): " in message
    assert "restart.policy: " in message  # from the file: named by its key path alone
    assert "HLOSERVE_NODE_RESTART__POLICY" not in message


def test_node_gateway_gets_every_worker_http_endpoint(tmp_path: Path) -> None:
    """The node's gateway serves KServe HTTP on Triton's port 8000 by default, over each
    worker's HTTP port, as serve's does; ``gateway.http_listen`` moves it or (null) turns it
    off, and the node's own keys are refused in ``settings``."""
    default = NodeConfig.model_validate({"repository": tmp_path, "cpu_workers": 2})
    gw = gateway_config(default, plan_workers(default))
    assert gw.worker_http == ("127.0.0.1:8100", "127.0.0.1:8103")
    assert gw.http_listen == "127.0.0.1:8000"
    assert planned_ports(default, plan_workers(default))["gateway http"] == ("127.0.0.1", 8000)
    moved = NodeConfig.model_validate(
        {"repository": tmp_path, "cpu_workers": 2, "gateway": {"http_listen": "127.0.0.1:9000"}}
    )
    assert gateway_config(moved, plan_workers(moved)).http_listen == "127.0.0.1:9000"
    off = NodeConfig.model_validate(
        {
            "repository": tmp_path,
            "cpu_workers": 2,
            "gateway": {"http_listen": None},
        }
    )
    assert gateway_config(off, plan_workers(off)).http_listen is None
    assert "gateway http" not in planned_ports(off, plan_workers(off))
    for key in ("http_listen", "worker_http"):
        with pytest.raises(ValidationError, match=f"{key} .*set by the node"):
            NodeConfig.model_validate(
                {"repository": tmp_path, "gateway": {"settings": {key: "127.0.0.1:9000"}}}
            )
    clash = NodeConfig.model_validate(
        {"repository": tmp_path, "cpu_workers": 2, "gateway": {"http_listen": "127.0.0.1:8103"}}
    )
    with pytest.raises(NodeConfigError, match="gateway http and worker 1 http both use port 8103"):
        planned_ports(clash, plan_workers(clash))
