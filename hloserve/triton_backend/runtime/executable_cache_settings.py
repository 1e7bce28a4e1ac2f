"""Where the executable cache lives and how big it may grow: flags, parameters, environment.

docs/serving.md, "Executable cache". The runtime's parameters ``hloserve.executable_cache`` and
``hloserve.executable_cache_bytes`` (written by ``--executable-cache`` and
``--executable-cache-bytes``) win over the environment (``HLOSERVE_EXECUTABLE_CACHE``,
``HLOSERVE_EXECUTABLE_CACHE_BYTES``: the project's settings scheme, :mod:`hloserve.settings`),
which wins over the defaults (:func:`default_directory`, :data:`DEFAULT_MAX_BYTES`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from hloserve import names
from hloserve.errors import InvalidArgumentError
from hloserve.model_parameters import RuntimeParameters
from hloserve.triton_backend.runtime.executable_cache import DEFAULT_MAX_BYTES, ExecutableCache

log = logging.getLogger("hloserve.triton_backend.runtime.executable_cache")

#: Environment prefix of the cache settings (the project's scheme, hloserve.settings):
#: ``HLOSERVE_EXECUTABLE_CACHE`` (directory or ``off``), ``HLOSERVE_EXECUTABLE_CACHE_BYTES``.
ENV_PREFIX = "HLOSERVE_EXECUTABLE_"


class ExecutableCacheSettings(BaseModel):
    """The cache's settings (flags, runtime parameters, environment: docs/serving.md).

    Attributes:
        cache: the directory; ``off`` disables the cache; "" = :func:`default_directory`.
        cache_bytes: the size bound in bytes (>= 1); default :data:`DEFAULT_MAX_BYTES`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    cache: str = ""
    cache_bytes: int = Field(default=DEFAULT_MAX_BYTES, ge=1)


def default_directory(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/hloserve/executables``, or ``~/.cache/hloserve/executables``.

    The XDG Base Directory Specification's user cache directory (specifications.freedesktop.org,
    basedir-spec): ``$XDG_CACHE_HOME`` when set to an absolute path, else ``$HOME/.cache``.
    """
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path(environ.get("HOME", "~")) / ".cache"
    return root.expanduser() / "hloserve" / "executables"


def cache_settings(
    parameters: Mapping[str, str],
    environ: Mapping[str, str] | None = None,
    *,
    model: str = names.RUNTIME_MODEL,
) -> ExecutableCacheSettings:
    """The runtime's settings: its parameters over ``HLOSERVE_EXECUTABLE_*`` over the defaults.

    Args:
        parameters: runtime parameter key -> value (``hloserve.executable_cache``,
            ``hloserve.executable_cache_bytes``; absent or "" = not set), read by
            :class:`~hloserve.model_parameters.RuntimeParameters`.
        environ: the environment (default ``os.environ``).
        model: the runtime model's name, for error messages.

    Raises:
        InvalidArgumentError: a variable naming no setting, or a bound that is not a positive
            integer (the parameter or variable is named).
    """
    from hloserve.settings import load_settings

    environ = os.environ if environ is None else environ
    settings = load_settings(
        ExecutableCacheSettings,
        what="executable cache settings",
        error=InvalidArgumentError,
        path=None,
        environ=environ,
        prefix=ENV_PREFIX,
        raw_keys=("cache",),  # "off" stays a string (YAML would read it as false)
    )
    updates: dict[str, Any] = {}
    directory = RuntimeParameters.read(model, parameters, names.PARAM_EXECUTABLE_CACHE)
    if directory:
        updates["cache"] = directory
    max_bytes = RuntimeParameters.read(model, parameters, names.PARAM_EXECUTABLE_CACHE_BYTES)
    if max_bytes:
        updates["cache_bytes"] = max_bytes
    return settings.model_copy(update=updates)


def executable_cache(
    settings: ExecutableCacheSettings,
    *,
    observer: Callable[[str, str], None] | None = None,
    source: str = "",
) -> ExecutableCache:
    """The cache ``settings`` describe (disabled for ``off``), with its directory logged.

    Args:
        settings: the settings.
        observer: see :class:`ExecutableCache`.
        source: where the directory setting came from, for the log line.

    Raises:
        InvalidArgumentError: a relative directory (the runtime's working directory is
            Triton's, not the user's).
    """
    said = f" (from {source})" if source else ""
    if settings.cache.strip().lower() == names.EXECUTABLE_CACHE_OFF:
        log.info("executable cache: off%s; every executable is compiled", said)
        return ExecutableCache(None, settings.cache_bytes, observer=observer)
    directory = Path(settings.cache).expanduser() if settings.cache else default_directory()
    if not directory.is_absolute():
        raise InvalidArgumentError(
            f"executable cache directory {settings.cache!r}{said} must be an absolute path "
            f"or {names.EXECUTABLE_CACHE_OFF!r}"
        )
    log.info(
        "executable cache: %s%s, bound %d bytes",
        directory,
        said or " (default)",
        settings.cache_bytes,
    )
    return ExecutableCache(directory, settings.cache_bytes, observer=observer)


def executable_cache_from_args(
    args: Any, observer: Callable[[str, str], None] | None = None
) -> ExecutableCache:
    """The runtime's cache from its config (``hloserve.model_parameters.ModelArgs``).

    Raises:
        InvalidArgumentError: a malformed setting, naming the runtime model.
    """
    parameters = args.parameters
    if RuntimeParameters.read(args.name, parameters, names.PARAM_EXECUTABLE_CACHE):
        source = f"parameter {names.PARAM_EXECUTABLE_CACHE}"
    elif os.environ.get(f"{ENV_PREFIX}CACHE", "").strip():
        source = f"{ENV_PREFIX}CACHE"
    else:
        source = ""
    named = f"model {args.name!r}: "
    try:
        settings = cache_settings(parameters, model=args.name)
        return executable_cache(settings, observer=observer, source=source)
    except InvalidArgumentError as exc:
        if exc.message.startswith(named):  # a parameter's error names the model already
            raise
        raise InvalidArgumentError(named + exc.message) from None


__all__ = [
    "ENV_PREFIX",
    "ExecutableCacheSettings",
    "cache_settings",
    "default_directory",
    "executable_cache",
    "executable_cache_from_args",
]
