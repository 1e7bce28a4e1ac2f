"""Prometheus scrape targets of a running node, as a ``file_sd_configs`` file (Prometheus docs,
"Configuration"): every worker's Triton metrics port, the gateway's and the supervisor's admin
ports, labelled ``job``, ``node`` and (workers) ``worker`` (docs/observability.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: ``job`` label of a worker's Triton metrics port.
WORKER_JOB = "hloserve-worker"
#: ``job`` label of the gateway's admin port (its own metrics and HAProxy's).
GATEWAY_JOB = "hloserve-gateway"
#: ``job`` label of the supervising process's admin port (workers up, restarts).
NODE_JOB = "hloserve-node"
#: Environment variable that overrides :func:`targets_dir`.
TARGETS_DIR_ENV = "HLOSERVE_PROMETHEUS_TARGETS_DIR"


def targets_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where nodes write their target files: ``$HLOSERVE_PROMETHEUS_TARGETS_DIR``, else
    ``$XDG_STATE_HOME/hloserve/prometheus`` (default ``~/.local/state``; XDG Base Directory)."""
    env = os.environ if environ is None else environ
    if env.get(TARGETS_DIR_ENV):
        return Path(env[TARGETS_DIR_ENV])
    state = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "hloserve" / "prometheus"


@dataclass(frozen=True)
class NodeTargets:
    """The scrape targets (``host:port``) of one node; ``node`` is also the file's name."""

    node: str
    workers: Sequence[str]
    gateway: str | None = None
    supervisor: str | None = None

    def groups(self) -> list[dict[str, object]]:
        """The ``file_sd_configs`` target groups."""
        base = {"node": self.node}
        groups: list[dict[str, object]] = [
            {"targets": [t], "labels": {**base, "job": WORKER_JOB, "worker": f"worker{i}"}}
            for i, t in enumerate(self.workers)
        ]
        if self.gateway:
            groups.append({"targets": [self.gateway], "labels": {**base, "job": GATEWAY_JOB}})
        if self.supervisor:
            groups.append({"targets": [self.supervisor], "labels": {**base, "job": NODE_JOB}})
        return groups


def write_targets(targets: NodeTargets, directory: Path | None = None) -> Path:
    """Write ``<directory>/<node>.json`` atomically (renamed into place); returns its path."""
    directory = directory or targets_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{targets.node}.json"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(targets.groups(), indent=2) + "\n")
    os.replace(tmp, path)
    return path
