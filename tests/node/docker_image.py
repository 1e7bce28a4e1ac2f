"""The CPU test image of the docker tests: a skeleton rootfs, built locally, cached by content.

No registry is reachable in CI, so nothing is pulled: the image is ``docker import`` of a tiny
tarball (the merged-/usr symlinks, the dynamic loader's cache and a few /etc files of this
host). Containers of it get this host's ``/usr``, Python (``sys.base_prefix``) and the project
checkout with its ``.venv`` as read-only bind mounts (:func:`test_mounts`), so they run the
same tritonserver (nvidia-pytriton wheel) and hloserve as the host, via ``hloserve serve``
(``docker.launcher: hloserve``). Building takes well under a second; an image whose
``hloserve.content`` label equals the tarball's hash is reused.
"""

from __future__ import annotations

import hashlib
import io
import sys
import tarfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
REPOSITORY = "hloserve-test-rootfs"
LABEL = "hloserve.content"

# /sbin is a directory, not the merged-/usr link: Docker mounts its init at /sbin/docker-init
# before the /usr bind mount, which would hide it behind the link.
_DIRS = ("usr", "etc", "tmp", "var", "var/tmp", "root", "dev", "proc", "sys", "run", "opt", "sbin")
_LINKS = {"bin": "usr/bin", "lib": "usr/lib", "lib64": "usr/lib64"}
_ETC = ("passwd", "group", "nsswitch.conf", "hosts", "ld.so.cache", "ld.so.conf")


def _tarball() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in _DIRS:
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name.endswith("tmp") else 0o755
            tar.addfile(info)
        for name, target in _LINKS.items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        for name in _ETC:
            path = Path("/etc") / name
            if path.is_file():
                data = path.read_bytes()
                info = tarfile.TarInfo(f"etc/{name}")
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
        conf_d = Path("/etc/ld.so.conf.d")
        if conf_d.is_dir():
            for path in sorted(conf_d.iterdir()):
                if path.is_file():
                    data = path.read_bytes()
                    info = tarfile.TarInfo(f"etc/ld.so.conf.d/{path.name}")
                    info.size, info.mode = len(data), 0o644
                    tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def ensure_test_image(client: Any) -> str:
    """Return the tag of the test image, importing it unless one with the same content exists."""
    data = _tarball()
    digest = hashlib.sha256(data).hexdigest()[:16]
    tag = f"{REPOSITORY}:{digest}"
    for image in client.images.list(filters={"label": f"{LABEL}={digest}"}):
        if tag in image.tags:
            return tag
    client.api.import_image_from_data(
        data, repository=REPOSITORY, tag=digest, changes=[f"LABEL {LABEL}={digest}"]
    )
    return tag


def container_mounts() -> list[str]:
    """Read-only bind mounts that give the skeleton this host's /usr, Python and checkout."""
    mounts = {"/usr", str(Path(sys.base_prefix).resolve()), str(ROOT)}
    return [f"{path}:{path}:ro" for path in sorted(mounts)]


def container_env() -> dict[str, str]:
    """PATH with the checkout's venv first, so ``hloserve`` and ``python3`` are the host's."""
    return {"PATH": f"{ROOT / '.venv' / 'bin'}:/usr/local/bin:/usr/bin:/bin"}
