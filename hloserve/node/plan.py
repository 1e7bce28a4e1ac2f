"""The plan of a node (:class:`NodePlan`) for ``serve`` and ``node up`` and both runtimes: GPUs,
workers, ports, environment, gateway settings, load list, restart policy (docs/deployment.md).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from hloserve.errors import GpuNotFoundError, InvalidArgumentError, NodeConfigError
from hloserve.gateway.config import ENV_PREFIX, GatewayConfig, load_config
from hloserve.node.node_config import NodeConfig, PortsConfig, RestartConfig
from hloserve.node.triton_options import TritonServerOptions
from hloserve.ports import free_ports

#: Flags of every worker: a model that fails to load neither stops the server nor makes it
#: unready; the others keep serving (docs/serving.md).
SERVING_FLAGS = ("--exit-on-error=false", "--strict-readiness=false")


@dataclass(frozen=True)
class WorkerPlan:
    """One worker of the node: 0-based ``index``, its host ``gpu`` (None: CPU), its ports."""

    index: int
    gpu: int | None
    http_port: int
    grpc_port: int
    metrics_port: int


@dataclass(frozen=True)
class NodePlan:
    """What :func:`hloserve.node.supervisor.run_node` runs, for ``serve`` and ``node up``:
    ``gateway`` None runs none; ``devices`` and ``prefix`` ("hloserve node NAME") word the
    report; ``admin_port`` None = 8003, off with a warning when taken."""

    servers: tuple[TritonServerOptions, ...]
    gateway: GatewayConfig | None = None
    devices: tuple[str, ...] = ()
    restart: RestartConfig = field(default_factory=RestartConfig)
    name: str = "hloserve"
    prefix: str = "hloserve"
    host: str = "127.0.0.1"
    admin_port: int | None = None
    startup_timeout_s: float | None = None

    @property
    def ready_timeout_s(self) -> float:
        """``startup_timeout_s``, else the largest of the servers' own."""
        return self.startup_timeout_s or max(o.startup_timeout_s for o in self.servers)


def device_name(gpu: int | None) -> str:
    """'GPU 3' or 'CPU'."""
    return "CPU" if gpu is None else f"GPU {gpu}"


def _query_gpus() -> tuple[tuple[int, str], ...]:
    """``(index, uuid)`` of each NVIDIA GPU in PCI bus order: NVML, else ``nvidia-smi``."""
    with contextlib.suppress(Exception):
        import pynvml

        pynvml.nvmlInit()
        try:
            count = int(pynvml.nvmlDeviceGetCount())
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            uuids = [pynvml.nvmlDeviceGetUUID(h) for h in handles]
            return tuple((i, u if isinstance(u, str) else u.decode()) for i, u in enumerate(uuids))
        finally:
            pynvml.nvmlShutdown()
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ()
    argv = [smi, "--query-gpu=index,uuid", "--format=csv,noheader"]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    rows = [[p.strip() for p in line.partition(",")[::2]] for line in out.splitlines()]
    return tuple((int(index), uuid) for index, uuid in rows if index.isdigit())


def detect_gpus(environ: Mapping[str, str] | None = None) -> tuple[int, ...]:
    """Indices (PCI bus order) of the NVIDIA GPUs this process may use, e.g. ``(0, 1)``: NVML's,
    else ``nvidia-smi``'s, restricted by ``CUDA_VISIBLE_DEVICES`` (indices or ``GPU-...`` UUIDs,
    CUDA's syntax) in its order; an empty one hides every GPU."""
    found = _query_gpus()
    visible = (os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return tuple(i for i, _ in found)
    by_name = {str(i): i for i, _ in found} | {u: i for i, u in found if u}
    chosen: dict[int, None] = {}
    for name in (n.strip() for n in visible.split(",")):
        if name not in by_name:
            break  # CUDA stops at the first entry it cannot resolve
        chosen.setdefault(by_name[name])
    return tuple(chosen)


def assign_gpus(
    gpus: str | Sequence[int] | None, workers: int | None, visible: Sequence[int]
) -> list[int | None]:
    """The GPU of each worker (None: a CPU worker), from ``--gpus`` and ``--workers`` (semantics:
    ``hloserve serve --help``; ``visible``: :func:`detect_gpus`); raises InvalidArgumentError:
    ``--workers`` below 1, disagreeing with ``--gpus``, or above the visible GPUs; a malformed
    ``--gpus``; GpuNotFoundError: a GPU asked for is not visible."""
    if workers is not None and workers < 1:
        raise InvalidArgumentError(f"--workers must be at least 1, got {workers}")
    if gpus == "none" or (gpus is None and not visible):
        return [None] * (workers or 1)
    if gpus is None:
        if workers is not None and workers > len(visible):
            raise InvalidArgumentError(
                f"--workers {workers} but {len(visible)} GPU(s) visible "
                f"({_ids(visible)}); use --gpus none for CPU workers"
            )
        return list(visible[: workers or len(visible)])
    if isinstance(gpus, str) and gpus != "all":
        parts = [p.strip() for p in gpus.split(",")]
        if not all(p.isdigit() for p in parts):
            raise InvalidArgumentError(f"--gpus takes all, none or indices like 0,1, got {gpus!r}")
        gpus = [int(p) for p in parts]
    if not visible:
        raise GpuNotFoundError(
            f"--gpus {_ids(gpus)}: GPU asked for but none is visible (NVML and nvidia-smi "
            "found none, or CUDA_VISIBLE_DEVICES hides them); use --gpus none (node file: "
            "cpu_workers) for CPU workers"
        )
    chosen: list[int] = list(visible) if gpus == "all" else [int(g) for g in gpus]
    if len(set(chosen)) != len(chosen):
        raise InvalidArgumentError(f"--gpus {_ids(chosen)} names a GPU twice")
    missing = [g for g in chosen if g not in visible]
    if missing:
        raise GpuNotFoundError(
            f"GPU {_ids(missing)} asked for but the visible GPUs are {_ids(visible)}"
        )
    if workers is not None and workers != len(chosen):
        raise InvalidArgumentError(
            f"--workers {workers} and --gpus {_ids(gpus)} ({len(chosen)} GPU(s)) disagree; "
            "give one of them, or both matching"
        )
    return [*chosen]


def _ids(values: Any) -> str:
    return values if isinstance(values, str) else ",".join(map(str, values))


def plan_workers(
    config: NodeConfig, available_gpus: Sequence[int] | None = None
) -> list[WorkerPlan]:
    """One :class:`WorkerPlan` per GPU (or CPU worker), ports from ``config.ports``;
    ``available_gpus`` None: :func:`detect_gpus`; raises GpuNotFoundError: GPUs asked for but
    none visible, or an index not visible; NodeConfigError: a worker's port passes 65535."""
    if config.cpu_workers:
        gpus = assign_gpus("none", config.cpu_workers, ())
    else:
        found = tuple(detect_gpus() if available_gpus is None else available_gpus)
        try:
            gpus = assign_gpus(config.gpus, None, found)
        except GpuNotFoundError as exc:
            raise GpuNotFoundError(f"node {config.name}: {exc}") from None
    plans = []
    for i, gpu in enumerate(gpus):
        http, grpc, metrics = config.ports.of_worker(i)
        if max(http, grpc, metrics) > 65535:
            raise NodeConfigError(f"node {config.name}: worker {i}'s ports pass 65535")
        plans.append(WorkerPlan(i, gpu, http, grpc, metrics))
    return plans


def connect_host(host: str) -> str:
    """Address to reach a server bound to ``host`` from this machine (wildcards -> loopback)."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def gateway_enabled(config: NodeConfig, workers: int) -> bool:
    """Whether the gateway runs: ``gateway.enabled`` or, for ``auto``, two or more workers."""
    enabled = config.gateway.enabled
    return workers >= 2 if enabled == "auto" else bool(enabled)


def worker_env(
    worker: WorkerPlan, *, docker: bool, repository: Path | None = None
) -> dict[str, str]:
    """Environment of a worker beyond its image's or the parent's: ``CUDA_DEVICE_ORDER``
    (NVML's), its GPU alone visible (a container: by its device request), or for a CPU worker
    none and JAX on the CPU; with ``repository``, a GPU worker's :func:`runtime_allocator_env`;
    raises InvalidArgumentError: see :func:`runtime_allocator_env`."""
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    if worker.gpu is None:
        return {**env, "CUDA_VISIBLE_DEVICES": "", "JAX_PLATFORMS": "cpu"}
    if repository is not None:
        env |= runtime_allocator_env(repository)
    return env if docker else {**env, "CUDA_VISIBLE_DEVICES": str(worker.gpu)}


def runtime_allocator_env(repository: Path) -> dict[str, str]:
    """JAX's allocator settings for the runtime model's ``hloserve.device_memory_fraction``
    (:func:`~hloserve.triton_backend.runtime.device_memory.allocator_environment`); raises
    InvalidArgumentError: the fraction is malformed, or the ``config.pbtxt`` does not parse."""
    from hloserve import names
    from hloserve.model_parameters import RuntimeParameters, string_values
    from hloserve.model_repository_tools.config import parse_config
    from hloserve.triton_backend.runtime.device_memory import allocator_environment

    fraction = 0.0
    config_path = repository / names.RUNTIME_MODEL / "config.pbtxt"
    if config_path.is_file():
        params = string_values(parse_config(config_path).parameters)
        key = names.PARAM_DEVICE_MEMORY_FRACTION
        fraction = RuntimeParameters.read(names.RUNTIME_MODEL, params, key)
    return allocator_environment(fraction, environ={})


def worker_admin_port(config: NodeConfig, worker: WorkerPlan) -> int:
    """The ``--admin-port`` of a worker container's ``hloserve serve``: ``ports.admin_base +
    i``, or 0 (a free port) when ``admin_base`` is 0."""
    return config.ports.admin_base + worker.index if config.ports.admin_base else 0


def planned_ports(config: NodeConfig, plan: Sequence[WorkerPlan]) -> dict[str, tuple[str, int]]:
    """Every port the node will bind: description -> (host, port); raises NodeConfigError: two of
    them are the same port."""
    ports: dict[str, tuple[str, int]] = {}
    for w in plan:
        named = {"http": w.http_port, "grpc": w.grpc_port, "metrics": w.metrics_port}
        serves = config.runtime == "docker" and config.docker.launcher == "hloserve"
        if serves and config.ports.admin_base:  # the admin port of its `hloserve serve`
            named["admin"] = worker_admin_port(config, w)
        ports.update({f"worker {w.index} {k}": (config.host, p) for k, p in named.items()})
    gateway = config.gateway
    if gateway_enabled(config, len(plan)):
        gw_host, _, gw_port = gateway.listen.rpartition(":")
        ports["gateway grpc"] = (gw_host.strip("[]"), int(gw_port))
        http_host, _, http_port = (gateway.http_listen or ":0").rpartition(":")
        if int(http_port):  # 0: a free port, picked when the gateway starts (None: no HTTP)
            ports["gateway http"] = (http_host.strip("[]"), int(http_port))
        if gateway.admin_port:
            ports["gateway admin"] = (gw_host.strip("[]"), gateway.admin_port)
    if config.admin_port:  # None: the default 8003, off with a warning when taken
        ports["admin"] = (config.host, config.admin_port)
    seen: dict[int, str] = {}
    for name, (_, port) in ports.items():
        if port in seen:
            raise NodeConfigError(
                f"node {config.name}: {name} and {seen[port]} both use port {port}"
            )
        seen[port] = name
    return ports


def _fleet_keys(
    workers: Sequence[tuple[str, int, int, int | None]],
    listen: str,
    http_listen: str | None,
    admin_port: int,
) -> dict[str, Any]:
    """The gateway keys a node sets, from each worker's ``(host, http, grpc, metrics)``."""
    return {
        "workers": [f"{h}:{grpc}" for h, _, grpc, _ in workers],
        "worker_metrics": [f"{h}:{m}" for h, _, _, m in workers if m is not None],
        "worker_http": [f"{h}:{http}" for h, http, _, _ in workers],
        "listen": listen,
        "http_listen": http_listen,
        "admin_port": admin_port,
    }


def gateway_config(
    config: NodeConfig, plan: Sequence[WorkerPlan], model_control_key: str | None = None
) -> GatewayConfig:
    """The gateway's settings over the node's workers (``upstream.model_control_key`` set from
    ``model_control_key``); raises NodeConfigError: ``gateway.settings`` holds an invalid gateway
    key or value."""
    from pydantic import ValidationError

    g, host = config.gateway, connect_host(config.host)
    workers = [(host, w.http_port, w.grpc_port, w.metrics_port) for w in plan]
    data = {**g.settings, **_fleet_keys(workers, g.listen, g.http_listen, g.admin_port)}
    if model_control_key:
        upstream = dict(data.get("upstream") or {})
        data["upstream"] = {**upstream, "model_control_key": model_control_key}
    try:
        return GatewayConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise NodeConfigError(f"node {config.name}: gateway.settings: {problems}") from None


#: Ports each worker takes from the base: HTTP, gRPC, metrics.
PORTS_PER_WORKER = 3


class WorkerPorts(NamedTuple):
    """The three ports of one worker."""

    http: int
    grpc: int
    metrics: int


def worker_ports(count: int, base: int, host: str = "127.0.0.1") -> list[WorkerPorts]:
    """The ports of ``count`` workers: worker i takes ``base + 3i`` .. ``base + 3i + 2``, as the
    node file's default port plan; ``base`` 0: free ports on ``host``; raises
    InvalidArgumentError: the range leaves 1..65535."""
    if base == 0:
        free = free_ports(PORTS_PER_WORKER * count, host)
        return [WorkerPorts(*free[i : i + 3]) for i in range(0, len(free), 3)]
    last = base + PORTS_PER_WORKER * count - 1
    if base < 1 or last > 65535:
        raise InvalidArgumentError(
            f"worker ports {base}..{last} ({count} workers x {PORTS_PER_WORKER}) "
            "are not all in 1..65535"
        )
    plan = PortsConfig(
        http_base=base, grpc_base=base + 1, metrics_base=base + 2, stride=PORTS_PER_WORKER
    )
    return [WorkerPorts(*plan.of_worker(i)) for i in range(count)]


def fleet_gateway_config(
    workers: Sequence[TritonServerOptions],
    listen: str,
    admin_port: int,
    path: Path | None = None,
    environ: Mapping[str, str] | None = None,
    http_listen: str | None = None,
    open_repository_api: bool = False,
) -> GatewayConfig:
    """The gateway's settings for ``serve --workers`` (or ``--open-repository-api``): the file
    and ``HLOSERVE_GATEWAY_*``, with the workers' endpoints, the listen addresses,
    ``admin_port`` and the workers' model-control key set from the fleet, and
    ``auth.open_repository_api`` when ``open_repository_api``.

    Raises:
        GatewayConfigError: the file or an environment override is invalid.
    """
    env = dict(os.environ if environ is None else environ)
    fleet = [(w.host, w.http_port, w.grpc_port, w.metrics_port) for w in workers]
    for key, value in _fleet_keys(fleet, listen, http_listen, admin_port).items():
        if value is not None:
            env[ENV_PREFIX + key.upper()] = (
                ",".join(value) if isinstance(value, list) else str(value)
            )
    keys = sorted({w.model_control_key for w in workers if w.model_control_key})
    if keys:  # restricted repository API: discovery needs the key (serve gives one to all)
        env[ENV_PREFIX + "UPSTREAM__MODEL_CONTROL_KEY"] = keys[0]
    if open_repository_api:
        env[ENV_PREFIX + "AUTH__OPEN_REPOSITORY_API"] = "true"
    return load_config(path, env)


def with_dependencies(repository: Path, models: Sequence[str]) -> tuple[str, ...]:
    """``models`` plus, in first-seen order, the models each meta's ``meta.calls`` names
    (transitively) and the runtime model. A name without a ``config.pbtxt`` is kept as is; raises
    InvalidArgumentError: a config.pbtxt does not parse."""
    from hloserve import names
    from hloserve.model_parameters import MetaParameters, string_values
    from hloserve.model_repository_tools.config import parse_config

    result: list[str] = []
    pending = list(models)
    while pending:
        name = pending.pop(0)
        if name in result:
            continue
        result.append(name)
        config_path = repository / name / "config.pbtxt"
        if not config_path.is_file():
            continue
        config = parse_config(config_path)
        if names.PARAM_META_CALLS in config.parameters:
            params = string_values(config.parameters)
            pending += MetaParameters.read(name, params, names.PARAM_META_CALLS)
    if names.RUNTIME_MODEL not in result:
        result.append(names.RUNTIME_MODEL)
    return tuple(result)


def runtime_first(options: TritonServerOptions) -> tuple[TritonServerOptions, tuple[str, ...]]:
    """Explicit-mode options loading only the runtime model at start, and the models to load
    once the server is ready (every front then finds the runtime serving); other options as
    they are, with nothing after."""
    from hloserve.names import RUNTIME_MODEL

    later = tuple(m for m in options.load_models if m != RUNTIME_MODEL)
    if options.model_control_mode != "explicit" or not later:
        return options, ()
    return replace(options, load_models=(RUNTIME_MODEL,)), later


def describe_exit(code: int) -> str:
    """'was killed by SIGKILL' or 'exited with code 3'."""
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def restart_allowed(policy: RestartConfig, exit_code: int, restarts: int) -> bool:
    """Whether a worker that exited with ``exit_code`` after ``restarts`` restarts starts
    again, under Docker's restart policy semantics (``max_retries`` 0: unlimited)."""
    if policy.policy in ("always", "unless-stopped"):
        return True
    return (
        policy.policy == "on-failure"
        and exit_code != 0
        and (policy.max_retries == 0 or restarts < policy.max_retries)
    )
