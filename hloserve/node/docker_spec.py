"""What the docker runtime of ``hloserve node`` asks the daemon for, as plain values
(:func:`container_spec`, pure; docs/deployment.md lists each setting and why).
"""

from __future__ import annotations

from typing import Any

from hloserve.node.node_config import NodeConfig
from hloserve.node.plan import WorkerPlan, runtime_first, worker_admin_port, worker_env
from hloserve.node.serve_options import node_server_options
from hloserve.node.triton_options import server_flags

#: Label holding the node name on every container of a node.
LABEL_NODE = "hloserve.node"
#: Label holding the worker index.
LABEL_WORKER = "hloserve.worker"
#: Label holding the GPU index, or "cpu".
LABEL_GPU = "hloserve.gpu"


def container_name(config: NodeConfig, worker: WorkerPlan) -> str:
    """Docker name of a worker's container: ``hloserve-<node>-worker<i>``."""
    return f"hloserve-{config.name}-worker{worker.index}"


#: The NGC worker image (``containers/worker.Dockerfile``) under its documented name.
NGC_WORKER_IMAGE = "hloserve-worker:24.12"


def _script_image(config: NodeConfig) -> str:
    """``scripts/images.sh``'s target for the ``hloserve`` launcher: ``gpu`` or ``cpu``."""
    return "cpu" if config.cpu_workers else "gpu"


def worker_image(config: NodeConfig) -> str:
    """The worker containers' image: ``docker.image``, else the launcher's under its documented
    name (docs/deployment.md, "The node file")."""
    if config.docker.image:
        return config.docker.image
    if config.docker.launcher == "hloserve":
        return f"hloserve-worker-{_script_image(config)}:latest"
    return NGC_WORKER_IMAGE


def image_build_command(config: NodeConfig) -> str:
    """The ``docker build`` line of the worker image (:func:`worker_image`) from this
    repository's Dockerfiles, as their headers write it (``--network=host``: a daemon without a
    bridge has no other build network)."""
    image = worker_image(config)
    if config.docker.launcher == "hloserve":
        dockerfile = f"worker-{_script_image(config)}.Dockerfile"
    else:
        dockerfile = "worker.Dockerfile"
    return f"docker build --network=host -f containers/{dockerfile} -t {image} ."


def image_build_hint(config: NodeConfig) -> str:
    """How to build the missing worker image: ``[TAG=..] bash scripts/images.sh cpu|gpu`` when
    the image has that script's name, then :func:`image_build_command`."""
    build = image_build_command(config)
    if config.docker.launcher != "hloserve":
        return build
    target = _script_image(config)
    name, _, tag = worker_image(config).partition(":")
    if name != f"hloserve-worker-{target}":
        return build
    tagged = "" if tag in ("", "latest") else f"TAG={tag} "
    return f"{tagged}bash scripts/images.sh {target}, or {build}"


def worker_command(
    config: NodeConfig, worker: WorkerPlan, model_control_key: str | None = None
) -> list[str]:
    """The container's command line: ``hloserve serve`` on the mounted repository, or the image's
    tritonserver with ``serve``'s flags (runtime model first: :func:`loads_when_ready`); raises
    InvalidArgumentError: a meta's ``config.pbtxt`` named in the load list does not parse."""
    repo = config.docker.repository_mount
    t = config.tritonserver
    if config.docker.launcher == "hloserve":
        argv = [
            "hloserve",
            "serve",
            repo,
            f"--host={config.host}",
            f"--http-port={worker.http_port}",
            f"--grpc-port={worker.grpc_port}",
            f"--metrics-port={worker.metrics_port}",
            f"--model-control-mode={t.model_control_mode}",
            *(f"--load-model={m}" for m in t.loads),
            f"--log-verbose={t.log_verbose}",
            f"--startup-timeout={t.startup_timeout_s:g}",
            f"--admin-port={worker_admin_port(config, worker)}",
        ]
        return [*argv, "--", *t.args] if t.args else argv
    options, _ = runtime_first(node_server_options(config, worker, model_control_key))
    flags = server_flags(options)
    if not any("shm-region-prefix-name" in flag for flag in flags):
        flags.append(f"--backend-config=python,shm-region-prefix-name={shm_prefix(config, worker)}")
    return [
        "tritonserver",
        f"--model-repository={repo}",
        f"--backend-directory={config.docker.backend_directory}",
        *flags,
    ]


def loads_when_ready(
    config: NodeConfig, worker: WorkerPlan, model_control_key: str | None = None
) -> tuple[str, ...]:
    """What a worker loads through its repository API once ready
    (:func:`~hloserve.node.plan.runtime_first`); nothing for the ``hloserve`` launcher."""
    if config.docker.launcher == "hloserve":
        return ()
    return runtime_first(node_server_options(config, worker, model_control_key))[1]


def shm_prefix(config: NodeConfig, worker: WorkerPlan) -> str:
    """The Python backend's ``shm-region-prefix-name`` of one worker container (unique: with
    ``docker.ipc: host`` they share the host's ``/dev/shm``)."""
    return f"hloserve-{config.name}-w{worker.index}-"


def container_spec(
    config: NodeConfig, worker: WorkerPlan, model_control_key: str | None = None
) -> dict[str, Any]:
    """Keyword arguments of ``containers.run`` for one worker, as plain JSON values (for
    :func:`to_sdk`; docs/deployment.md, the container table)."""
    d = config.docker
    volumes: dict[str, dict[str, str]] = {
        str(config.repository.resolve()): {"bind": d.repository_mount, "mode": "ro"}
    }
    for mount in d.mounts:
        host, bind, *mode = mount.split(":")
        volumes[host] = {"bind": bind, "mode": mode[0] if mode else "ro"}
    env = {**worker_env(worker, docker=True, repository=config.repository), **d.env}
    explicit = config.tritonserver.model_control_mode == "explicit"
    if model_control_key and explicit and d.launcher == "hloserve":
        from hloserve.model_control import ENV_KEY

        env[ENV_KEY] = model_control_key
    gpu = {"driver": d.gpu_driver, "device_ids": [str(worker.gpu)], "capabilities": [["gpu"]]}
    policy: dict[str, Any] = {"Name": config.restart.policy}
    if config.restart.policy == "on-failure":
        policy["MaximumRetryCount"] = config.restart.max_retries
    return {
        "image": worker_image(config),
        "name": container_name(config, worker),
        "command": worker_command(config, worker, model_control_key),
        "labels": {
            LABEL_NODE: config.name,
            LABEL_WORKER: str(worker.index),
            LABEL_GPU: "cpu" if worker.gpu is None else str(worker.gpu),
        },
        "environment": env,
        "network_mode": "host",
        "ipc_mode": d.ipc,
        **({"shm_size": d.shm_size} if d.ipc == "private" else {}),
        "volumes": volumes,
        "ulimits": [{"name": k, "soft": v, "hard": v} for k, v in d.ulimits.items()],
        "device_requests": [] if worker.gpu is None else [gpu],
        "restart_policy": policy,
        "init": True,
        "detach": True,
    }


def to_sdk(spec: dict[str, Any]) -> dict[str, Any]:
    """:func:`container_spec`'s dict with the docker SDK's ``DeviceRequest``/``Ulimit`` types."""
    from docker.types import DeviceRequest, Ulimit

    kwargs = dict(spec)
    kwargs["device_requests"] = [DeviceRequest(**r) for r in spec["device_requests"]] or None
    kwargs["ulimits"] = [Ulimit(**u) for u in spec["ulimits"]]
    return kwargs
