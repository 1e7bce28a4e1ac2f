"""Fixtures of the container tests: a Docker daemon and the images built once per session."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.node.docker_image import Images, ensure_images


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    """The local daemon; skip without one, unless ``HLOSERVE_REQUIRE_DOCKER=1`` (CI)."""
    pytest.importorskip("docker")
    from hloserve.errors import NodeError
    from hloserve.node.docker_runtime import connect

    try:
        daemon = connect()
    except NodeError as exc:
        if os.environ.get("HLOSERVE_REQUIRE_DOCKER") == "1":
            pytest.fail(f"HLOSERVE_REQUIRE_DOCKER=1 but {exc}")
        pytest.skip(f"{exc} (scripts/docker.sh starts one as root)")
    yield daemon
    daemon.close()


@pytest.fixture(scope="session")
def images(docker_client: Any) -> Images:
    """The CPU worker and gateway images (scripts/images.sh, once per session)."""
    return ensure_images()


def world_readable(tree: Path) -> Path:
    """Let the images' user (UID 10001) read ``tree``, as a deployment's repository must be."""
    for path in [tree, *tree.rglob("*")]:
        if not path.is_symlink():
            extra = stat.S_IRGRP | stat.S_IROTH
            if path.is_dir():
                extra |= stat.S_IXGRP | stat.S_IXOTH
            path.chmod(path.stat().st_mode | extra)
    return tree
