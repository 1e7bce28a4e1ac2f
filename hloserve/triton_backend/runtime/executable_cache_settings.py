"""Where the executable cache lives and how big it may grow (docs/serving.md, "Executable
cache"): runtime parameters over ``HLOSERVE_EXECUTABLE_*`` (:mod:`hloserve.settings`) over the
defaults."""

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

#: ``HLOSERVE_EXECUTABLE_CACHE`` (directory or ``off``), ``HLOSERVE_EXECUTABLE_CACHE_BYTES``
ENV_PREFIX = "HLOSERVE_EXECUTABLE_"


class ExecutableCacheSettings(BaseModel):
    """The cache's settings: ``cache`` a directory, ``off``, or "" (the default directory)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cache: str = ""
    cache_bytes: int = Field(default=DEFAULT_MAX_BYTES, ge=1)


def default_directory(environ: Mapping[str, str] | None = None) -> Path:
    """The XDG user cache directory's ``hloserve/executables`` (``$XDG_CACHE_HOME`` when
    absolute, else ``$HOME/.cache``; freedesktop.org basedir-spec)."""
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
    """The runtime's settings: its ``parameters`` over ``HLOSERVE_EXECUTABLE_*`` over the
    defaults; InvalidArgumentError (naming the parameter or variable) for a variable naming no
    setting or a bound that is not a positive integer."""
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
    """The cache ``settings`` describe (off: disabled), its directory logged with ``source``
    (where the setting came from); InvalidArgumentError for a relative directory."""
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
    """The runtime's cache from its config; InvalidArgumentError naming the runtime model."""
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
