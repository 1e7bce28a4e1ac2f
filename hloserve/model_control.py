"""Keeping Triton's model control (load/unload) from clients that do not hold a key.

hloserve runs tritonserver with ``--model-control-mode=explicit`` so that its stub watchdog can
reload a model whose process died (docs/serving.md). Explicit mode opens Triton's repository
API (index, load, unload; a load may carry model files, and a Python model is code) to every
client reaching the port, so the launcher restricts that API with tritonserver 2.51's
``--http-restricted-api`` and ``--grpc-restricted-protocol``: a repository call must carry the
header :data:`HEADER` with a key the launcher generates (:func:`new_key`, one per process) or
takes from :data:`ENV_KEY`, and only the launcher's own clients (the watchdog, the gateway's
discovery) send it. Without it Triton refuses the call: HTTP 403 and gRPC UNAVAILABLE "This
API is restricted, expecting header '<header>'" (measured on 2.51). Every other API
(inference, health, metadata, model config, statistics) stays open.

Triton prefixes the header of a restricted gRPC protocol with ``triton-grpc-protocol-``
(measured on 2.51), so gRPC clients send :func:`grpc_metadata`, HTTP clients
:func:`http_headers`.

:mod:`hloserve.node.model_control_client` calls that API with the key (``serve --watch``).
"""

from __future__ import annotations

import os
import re
import secrets
import threading
from collections.abc import Mapping

from hloserve.errors import InvalidArgumentError

#: Header (HTTP) that carries the model-control key; the gRPC metadata key is
#: :data:`GRPC_METADATA_KEY`.
HEADER = "hloserve-model-control"
#: What tritonserver 2.51 expects on gRPC for :data:`HEADER` (it adds this prefix).
GRPC_METADATA_KEY = "triton-grpc-protocol-" + HEADER
#: The restricted API groups (Triton's names): the repository API only.
RESTRICTED = "model-repository"
#: Environment variable that fixes the key instead of a random one (so that another process,
#: such as a separately started gateway or an operator's client, can hold it too).
ENV_KEY = "HLOSERVE_MODEL_CONTROL_KEY"
#: A letter first, so that a key never reads as a YAML number or boolean (the gateway's
#: environment overrides are parsed as YAML scalars).
_KEY_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9_.~-]{15,255}")


def new_key() -> str:
    """A random key: ``"hm"`` and 32 hex digits (128 bits, :func:`secrets.token_hex`)."""
    return "hm" + secrets.token_hex(16)


def check_key(key: str) -> str:
    """``key`` if tritonserver can carry it in its restricted-API flags.

    Raises:
        InvalidArgumentError: not 16 to 256 characters of ``A-Z a-z 0-9 _ . ~ -`` starting
            with a letter (``=``, ``,`` and ``:`` separate the flag's fields; short keys are
            guessable).
    """
    if not _KEY_PATTERN.fullmatch(key):
        raise InvalidArgumentError(
            f"the model-control key ({ENV_KEY}) must be 16 to 256 characters of letters, "
            "digits and _ . ~ -, starting with a letter"
        )
    return key


_process_key: str | None = None
_process_key_lock = threading.Lock()


def launcher_key(environ: Mapping[str, str] | None = None) -> str:
    """The key this process's launchers use: :data:`ENV_KEY` when set (checked), else one
    :func:`new_key` made on the first call and kept for the life of the process, so that
    every server one process starts (``serve --workers``, ``node up``, tests) shares it and
    an in-process gateway can send it (:func:`local_key`).

    Raises:
        InvalidArgumentError: :data:`ENV_KEY` is set to an unusable key (:func:`check_key`).
    """
    global _process_key
    key = local_key(environ)
    if key is not None:
        return key
    with _process_key_lock:
        if _process_key is None:
            _process_key = new_key()
        return _process_key


def local_key(environ: Mapping[str, str] | None = None) -> str | None:
    """The key a gateway sends when its config names none: :data:`ENV_KEY` when set, else the
    key this process's launchers made (None when they made none)."""
    value = (os.environ if environ is None else environ).get(ENV_KEY, "")
    if value:
        return check_key(value)
    with _process_key_lock:
        return _process_key


def restricted_flags(key: str) -> list[str]:
    """tritonserver flags restricting the repository API to callers sending ``key``."""
    check_key(key)
    return [
        f"--http-restricted-api={RESTRICTED}:{HEADER}={key}",
        f"--grpc-restricted-protocol={RESTRICTED}:{HEADER}={key}",
    ]


def http_headers(key: str | None) -> dict[str, str] | None:
    """The headers of an HTTP repository call (tritonclient's ``headers=``); None without key."""
    return None if key is None else {HEADER: key}


def grpc_metadata(key: str | None) -> tuple[tuple[str, str], ...]:
    """The metadata of a gRPC repository call (grpc's ``metadata=``); empty without key."""
    return () if key is None else ((GRPC_METADATA_KEY, key),)
