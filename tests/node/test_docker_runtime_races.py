"""``hloserve node down`` racing ``node up`` over the same containers, without a Docker daemon.

The docker SDK's listing inspects each container after listing the ids; a container removed in
between raises ``NotFound`` unless ``ignore_removed`` is set. A fake SDK collection with that
exact behaviour stands in for the daemon (the race is pure client logic).
"""

from __future__ import annotations

from typing import Any

import pytest

docker = pytest.importorskip("docker")

from hloserve.node import docker_runtime  # noqa: E402
from hloserve.node.docker_spec import LABEL_WORKER  # noqa: E402


class _Container:
    def __init__(self, name: str, worker: int, collection: _Containers) -> None:
        self.name = name
        self.labels = {LABEL_WORKER: str(worker)}
        self._collection = collection

    def stop(self, timeout: int) -> None:
        del timeout
        self._collection.removed_by_other(self.name)
        raise docker.errors.NotFound(f"No such container: {self.name}")

    def remove(self, force: bool) -> None:  # pragma: no cover - stop already raised NotFound
        raise AssertionError("remove after NotFound")


class _Containers:
    """Lists two containers; the first is removed by someone else between listing and inspection."""

    def __init__(self) -> None:
        self.alive = {"w1": _Container("w1", 1, self), "w0": _Container("w0", 0, self)}
        self.vanishing = "w0"

    def removed_by_other(self, name: str) -> None:
        self.alive.pop(name, None)

    def list(self, all: bool, filters: dict[str, str], ignore_removed: bool = False) -> list[Any]:
        assert all and filters
        names = list(self.alive)
        self.alive.pop(self.vanishing, None)  # removed by `node up` right after the id listing
        found = []
        for name in names:
            if name not in self.alive:
                if not ignore_removed:
                    raise docker.errors.NotFound(f"No such container: {name}")
                continue
            found.append(self.alive[name])
        return found


class _Client:
    def __init__(self) -> None:
        self.containers = _Containers()


def test_node_down_ignores_containers_removed_concurrently(monkeypatch: pytest.MonkeyPatch) -> None:
    client = _Client()
    monkeypatch.setattr(docker_runtime, "connect", lambda: client)
    removed = docker_runtime.remove_node_containers("n", timeout_s=1)
    assert removed == ["w1"]
    assert client.containers.alive == {}
