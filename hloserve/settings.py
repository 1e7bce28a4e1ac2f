"""Typed settings from a YAML file plus environment overrides (gateway, node).

One variable per key path, ``__`` between levels, case-insensitive after the prefix
(``HLOSERVE_GATEWAY_SCHEDULING__HYSTERESIS=0.2``); values are YAML scalars, except list keys
(comma-separated) and raw keys. A variable naming no setting, or a whole section, is an error.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from hloserve.errors import HloserveError

Settings = TypeVar("Settings", bound=BaseModel)


def env_overrides(
    environ: Mapping[str, str],
    prefix: str,
    root: type[BaseModel],
    *,
    list_keys: Collection[str] = (),
    raw_keys: Collection[str] = (),
    no_env_keys: Collection[str] = (),
) -> tuple[dict[str, Any], list[str], dict[tuple[str, ...], str]]:
    """``(overrides, problems, variables)`` of the ``prefix`` variables for ``root``: a nested
    dict to merge over the file's data, one line per variable naming no setting, and key path
    -> the variable that set it. ``list_keys`` are comma-separated, ``raw_keys`` kept as
    strings, ``no_env_keys`` have no environment form."""
    overrides: dict[str, Any] = {}
    problems: list[str] = []
    variables: dict[tuple[str, ...], str] = {}
    for name in sorted(environ):
        if not name.startswith(prefix):
            continue
        path = [part.lower() for part in name[len(prefix) :].split("__")]
        model = root
        for i, key in enumerate(path):
            field = model.model_fields.get(key)
            if field is None or key in no_env_keys:
                problems.append(f"{name}: names no setting ({'.'.join(path[: i + 1])})")
                break
            annotation = field.annotation
            is_last = i == len(path) - 1
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                if is_last:
                    problems.append(f"{name}: {'.'.join(path)} is a section, name one of its keys")
                    break
                model = annotation
                continue
            if not is_last:
                problems.append(f"{name}: {'.'.join(path[: i + 1])} has no sub-keys")
                break
            target = overrides
            for part in path[:-1]:
                target = target.setdefault(part, {})
            target[key] = _env_value(environ[name], key in list_keys, key in raw_keys)
            variables[tuple(path)] = name
    return overrides, problems, variables


def _env_value(raw: str, is_list: bool, is_raw: bool) -> Any:
    if is_list:
        return [item.strip() for item in raw.split(",") if item.strip()]
    if is_raw or not raw.strip():
        return raw
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``override`` laid over it, sections merged key by key (new dict)."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_settings(
    model: type[Settings],
    *,
    what: str,
    error: type[HloserveError],
    path: str | Path | None,
    environ: Mapping[str, str],
    prefix: str,
    list_keys: Collection[str] = (),
    raw_keys: Collection[str] = (),
    no_env_keys: Collection[str] = (),
    prepare_file: Callable[[dict[str, Any], Path], None] | None = None,
) -> Settings:
    """Read ``model`` from a YAML file (``path``; None = environment alone) and ``prefix`` variables
    (:func:`env_overrides`). ``what`` names it in messages; ``prepare_file`` adjusts the file's data
    in place first; raises ``error``: unreadable file, not a mapping, unknown key or variable, or a
    value out of range, naming every offending key path (and the variable that set it)."""
    data: dict[str, Any] = {}
    source = "environment"
    if path is not None:
        source = str(path)
        try:
            data = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise error(f"{what} {path}: cannot read it: {exc}") from None
        data = {} if data is None else data
        if not isinstance(data, dict):
            raise error(f"{what} {path}: expected a mapping at the top")
        if prepare_file is not None:
            prepare_file(data, Path(path))
    overrides, problems, variables = env_overrides(
        environ, prefix, model, list_keys=list_keys, raw_keys=raw_keys, no_env_keys=no_env_keys
    )
    if problems:
        raise error(f"{what} environment: " + "; ".join(problems))
    try:
        return model.model_validate(merge(data, overrides))
    except ValidationError as exc:
        raise error(f"{what} {source}: " + "; ".join(_problems(exc, variables))) from None


def _problems(exc: ValidationError, variables: Mapping[tuple[str, ...], str]) -> list[str]:
    found = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top)"
        loc = tuple(str(p) for p in err["loc"])
        variable = next(
            (variables[loc[:n]] for n in range(len(loc), 0, -1) if loc[:n] in variables), None
        )
        if variable is not None:
            where = f"{variable} (environment, {where})"
        found.append(f"{where}: {error_message(err)}")
    return found


_MESSAGES = {"missing": "required key is missing", "extra_forbidden": "unknown key"}


def error_message(err: Mapping[str, Any]) -> str:
    """A pydantic error's text: ``required key is missing``, ``unknown key``, or its message."""
    return _MESSAGES.get(err["type"], str(err["msg"]).removeprefix("Value error, "))
