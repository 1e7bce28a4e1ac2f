"""Prometheus scrape targets of a running node, as a file-based service discovery file.

``hloserve serve`` and ``hloserve node up`` write one JSON file per running node into
:func:`targets_dir` (Prometheus' ``file_sd_configs`` format, Prometheus docs "Configuration":
``<file_sd_config>``): every worker's Triton metrics port, the gateway's admin port, and the
supervising process's own admin port. A Prometheus whose ``file_sd_configs`` globs that
directory (``containers/prometheus/prometheus.yml``) scrapes every node started on the machine
and drops a node's targets when its file is removed at stop. Each target carries the labels
``job`` (:data:`WORKER_JOB`, :data:`GATEWAY_JOB`, :data:`NODE_JOB`), ``node`` and, for a
worker, ``worker`` (``worker0``, ...): dashboards select on them (docs/observability.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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
    """Where nodes write their target files.

    ``$HLOSERVE_PROMETHEUS_TARGETS_DIR`` when set, else ``$XDG_STATE_HOME/hloserve/prometheus``
    (XDG Base Directory spec; ``~/.local/state`` when ``XDG_STATE_HOME`` is unset).
    """
    env = os.environ if environ is None else environ
    if env.get(TARGETS_DIR_ENV):
        return Path(env[TARGETS_DIR_ENV])
    state = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "hloserve" / "prometheus"


@dataclass(frozen=True)
class NodeTargets:
    """The scrape targets of one node.

    Attributes:
        node: the node's name (``node`` label); also the file's name.
        workers: each worker's ``host:port`` of Triton's metrics endpoint, in worker order.
        gateway: the gateway's admin ``host:port``, or None with one worker.
        supervisor: the supervising process's admin ``host:port``, or None.
    """

    node: str
    workers: Sequence[str]
    gateway: str | None = None
    supervisor: str | None = None
    extra_labels: Mapping[str, str] = field(default_factory=dict)

    def groups(self) -> list[dict[str, object]]:
        """The ``file_sd_configs`` target groups."""
        base = {"node": self.node, **self.extra_labels}
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
    """Write ``<directory>/<node>.json`` atomically (a temporary file renamed into place).

    Returns:
        The file written; :func:`remove_targets` deletes it at stop.
    """
    directory = directory or targets_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{targets.node}.json"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(targets.groups(), indent=2) + "\n")
    os.replace(tmp, path)
    return path


def remove_targets(path: Path) -> None:
    """Delete a target file written by :func:`write_targets` (gone already is fine)."""
    path.unlink(missing_ok=True)
