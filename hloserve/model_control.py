"""Keeping Triton's model control (load/unload) from clients that do not hold a key.

tritonserver runs in explicit model-control mode with its repository API restricted
(``--http-restricted-api``, ``--grpc-restricted-protocol``) to callers sending :data:`HEADER`
with the launcher's key; gRPC clients send it as :data:`GRPC_METADATA_KEY` (Triton adds the
prefix). Other APIs stay open. docs/gateway.md and docs/deployment.md give the details.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import threading
import time
from collections.abc import Mapping
from typing import Any

from hloserve.errors import InvalidArgumentError

#: HTTP header that carries the model-control key.
HEADER = "hloserve-model-control"
#: What tritonserver 2.51 expects on gRPC for :data:`HEADER` (it adds this prefix).
GRPC_METADATA_KEY = "triton-grpc-protocol-" + HEADER
#: The restricted API groups (Triton's names): the repository API only.
RESTRICTED = "model-repository"
#: Environment variable that fixes the key instead of a random one (shared with other processes).
ENV_KEY = "HLOSERVE_MODEL_CONTROL_KEY"
#: A letter first: a key never reads as a YAML number or boolean (environment overrides).
_KEY_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9_.~-]{15,255}")


def new_key() -> str:
    """A random key: ``"hm"`` and 32 hex digits (128 bits, :func:`secrets.token_hex`)."""
    return "hm" + secrets.token_hex(16)


def check_key(key: str) -> str:
    """``key`` if tritonserver can carry it in its restricted-API flags; raises
    InvalidArgumentError: not 16 to 256 characters of ``A-Z a-z 0-9 _ . ~ -`` starting with a
    letter."""
    if not _KEY_PATTERN.fullmatch(key):
        raise InvalidArgumentError(
            f"the model-control key ({ENV_KEY}) must be 16 to 256 characters of letters, "
            "digits and _ . ~ -, starting with a letter"
        )
    return key


_process_key: str | None = None
_process_key_lock = threading.Lock()


def launcher_key(environ: Mapping[str, str] | None = None) -> str:
    """The key this process's launchers use: :data:`ENV_KEY` when set, else one :func:`new_key` kept
    for the life of the process (every server it starts shares it); raises InvalidArgumentError:
    :data:`ENV_KEY` is set to an unusable key (:func:`check_key`)."""
    global _process_key
    key = local_key(environ)
    if key is not None:
        return key
    with _process_key_lock:
        if _process_key is None:
            _process_key = new_key()
        return _process_key


def local_key(environ: Mapping[str, str] | None = None) -> str | None:
    """:data:`ENV_KEY` when set, else the key this process's launchers made, else None."""
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


class RepositoryClient:
    """Triton's repository API of one tritonserver (``host:port``) over HTTP, sending ``key``
    (None: none). ``timeout_s`` bounds each call, compiling included. Errors are tritonclient's
    ``InferenceServerException`` or a connection error."""

    def __init__(self, http_url: str, key: str | None, timeout_s: float) -> None:
        self.http_url = http_url
        self.headers = http_headers(key) or {}
        self.timeout_s = timeout_s

    def _client(self) -> Any:
        import tritonclient.http as httpclient

        return httpclient.InferenceServerClient(
            self.http_url, connection_timeout=self.timeout_s, network_timeout=self.timeout_s
        )

    def index(self) -> list[dict[str, Any]]:
        """Triton's repository index: ``[{"name", "version", "state", "reason"}, ...]``."""
        with self._client() as client:
            return list(client.get_model_repository_index(headers=self.headers))

    def load(self, model: str) -> None:
        """Load (or reload from changed files) ``model`` from the repository."""
        with self._client() as client:
            client.load_model(model, headers=self.headers)

    def reload(self, model: str) -> None:
        """Load ``model`` again with its current configuration (fresh instances swapped in)."""
        with self._client() as client:
            config = client.get_model_config(model)
            client.load_model(model, headers=self.headers, config=json.dumps(config))

    def unload(self, model: str) -> None:
        """Unload ``model`` and wait (up to the timeout) until it is no longer READY or
        UNLOADING."""
        with self._client() as client:
            client.unload_model(model, headers=self.headers)
            deadline = time.monotonic() + self.timeout_s
            while time.monotonic() < deadline:
                index = client.get_model_repository_index(headers=self.headers)
                states = {m["name"]: m.get("state", "") for m in index}
                if states.get(model) not in ("READY", "UNLOADING"):
                    return
                time.sleep(0.1)
