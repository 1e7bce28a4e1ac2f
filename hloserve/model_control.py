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

:class:`RepositoryClient` calls that API with the key.
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


class RepositoryClient:
    """Triton's repository API (index, load, reload, unload) of one tritonserver over HTTP,
    sending the model-control key: the one client of it (``serve``'s watcher and stub
    watchdog, the node supervisor's ready report; the gateway relays its clients' calls).

    Args:
        http_url: the server's HTTP endpoint, ``host:port``.
        key: the restricted repository API's key (:func:`launcher_key`); None: none sent.
        timeout_s: seconds one call may take (a load's compiling included).

    Errors are tritonclient's ``InferenceServerException`` (Triton's refusal, e.g.
    "explicit model load / unload is not allowed" outside explicit mode) or a connection
    error.
    """

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
        client = self._client()
        try:
            return list(client.get_model_repository_index(headers=self.headers))
        finally:
            client.close()

    def load(self, model: str) -> None:
        """Load (or reload from changed files) ``model`` from the repository."""
        client = self._client()
        try:
            client.load_model(model, headers=self.headers)
        finally:
            client.close()

    def reload(self, model: str) -> None:
        """Load ``model`` again with its current configuration, even though no file changed
        (Triton then loads fresh instances and swaps them in)."""
        client = self._client()
        try:
            config = client.get_model_config(model)
            client.load_model(model, headers=self.headers, config=json.dumps(config))
        finally:
            client.close()

    def unload(self, model: str) -> None:
        """Unload ``model`` and wait (up to the timeout) until the index no longer lists it
        READY or UNLOADING: Triton unloads once the requests in flight end."""
        client = self._client()
        try:
            client.unload_model(model, headers=self.headers)
            deadline = time.monotonic() + self.timeout_s
            while time.monotonic() < deadline:
                index = client.get_model_repository_index(headers=self.headers)
                states = {m["name"]: m.get("state", "") for m in index}
                if states.get(model) not in ("READY", "UNLOADING"):
                    return
                time.sleep(0.1)
        finally:
            client.close()
