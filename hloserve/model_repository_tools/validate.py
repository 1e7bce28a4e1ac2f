"""Check a generated model repository: every config parses and equals what its bundle copy
gives (with the instance count and queue delay it was built with), front spec files included;
models of other backends are left alone.
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any, TypeVar

from hloserve import names
from hloserve.bundle.bundle import Bundle
from hloserve.bundle.front_spec import front_spec, read_front_spec
from hloserve.bundle.validate import Problem, check_bundle
from hloserve.errors import BundleError, HloserveError, InvalidArgumentError, NotFoundError
from hloserve.model_parameters import (
    FrontParameters,
    MetaParameters,
    ModelParameters,
    RuntimeParameters,
    string_values,
)
from hloserve.model_repository_tools.build_options import BuildOptions
from hloserve.model_repository_tools.config import (
    config_text,
    front_config,
    meta_config,
    parse_config,
    runtime_config,
)
from hloserve.model_repository_tools.foreign import CONFIG_FILE

K = TypeVar("K", bound=ModelParameters)


def validate_repository(repo_dir: Path | str) -> list[Problem]:
    """Every problem (``file`` relative to the repository) found at ``repo_dir``; [] = consistent.
    NotFoundError when ``repo_dir`` is not a directory."""
    root = Path(repo_dir)
    if not root.is_dir():
        raise NotFoundError(f"{root}: no such directory")
    problems: list[Problem] = []
    fronts: dict[str, Bundle | None] = {}
    runtime: Any = None
    for model_dir in sorted(p for p in root.iterdir() if p.is_dir() and not _hidden(p)):
        file = f"{model_dir.name}/{CONFIG_FILE}"
        try:
            config = parse_config(model_dir / CONFIG_FILE)
        except HloserveError as exc:
            problems.append(Problem(file, exc.message))
            continue
        if config.name and config.name != model_dir.name:
            problems.append(Problem(file, f"name {config.name!r} is not the directory's name"))
        if config.backend == names.FRONT_BACKEND:
            bundle, found = _check_front(model_dir, config)
            fronts[model_dir.name] = bundle
            problems += found
        elif config.backend == names.META_BACKEND:
            problems += _check_meta(root, model_dir, config)
        elif config.backend == names.RUNTIME_BACKEND:
            if model_dir.name != names.RUNTIME_MODEL:
                problems.append(
                    Problem(file, f"runtime model must be named {names.RUNTIME_MODEL!r}")
                )
            else:
                runtime = config
    problems += _check_runtime(runtime, fronts)
    return problems


def _hidden(path: Path) -> bool:
    return path.name.startswith(".")


def _read(file: str, model: str, kind: type[K], config: Any) -> tuple[K | None, list[Problem]]:
    """``config``'s parameters read as ``kind``, or the problem that stops it."""
    try:
        return kind.from_parameters(model, string_values(config.parameters)), []
    except InvalidArgumentError as exc:
        return None, [Problem(file, exc.message)]


def _check_front(model_dir: Path, config: Any) -> tuple[Bundle | None, list[Problem]]:
    file = f"{model_dir.name}/{CONFIG_FILE}"
    params, problems = _read(file, model_dir.name, FrontParameters, config)
    if params is None:
        return None, problems
    if params.runtime_model != names.RUNTIME_MODEL:
        problems.append(
            Problem(
                file,
                f"parameter {names.PARAM_RUNTIME_MODEL} is {params.runtime_model!r}, "
                f"expected {names.RUNTIME_MODEL!r}",
            )
        )
    try:
        bundle = check_bundle(model_dir / params.bundle, name=model_dir.name)
    except BundleError as exc:
        rel = f"{model_dir.name}/{params.bundle}"
        return None, problems + [Problem(f"{rel}/{p.file}", p.message) for p in exc.problems]
    except HloserveError as exc:
        return None, [*problems, Problem(file, exc.message)]
    groups = list(config.instance_group)
    instances = groups[0].count if len(groups) == 1 else 0
    built = BuildOptions(
        front_instances=max(instances, 1),
        max_queue_delay_us=config.dynamic_batching.max_queue_delay_microseconds
        or config.sequence_batching.oldest.max_queue_delay_microseconds,
        **_build_fields(params),
    )
    expected = front_config(model_dir.name, bundle.manifest, built)
    _same_version_folder(expected, params.bundle)
    problems += _compare(file, config, expected)
    problems += _check_front_spec(model_dir, bundle)
    return bundle, problems


def _same_version_folder(expected: Any, bundle_param: str) -> None:
    """Accept the bundle in any version folder (``<N>/bundle``: ``serve --watch`` installs N+1)."""
    version, _, leaf = bundle_param.partition("/")
    if version.isdigit() and f"{names.MODEL_VERSION}/{leaf}" == names.BUNDLE_SUBDIR:
        expected.parameters[names.PARAM_BUNDLE].string_value = bundle_param


def _check_front_spec(model_dir: Path, bundle: Bundle) -> list[Problem]:
    """The front spec file (when present) matches the bundle copy's manifest."""
    path = bundle.path.parent / Path(names.FRONT_SPEC).name  # beside the bundle, any version
    file = f"{model_dir.name}/{path.parent.name}/{path.name}"
    if not path.is_file():
        return []
    try:
        written = read_front_spec(path)
    except HloserveError as exc:
        return [Problem(file, exc.message)]
    if written != front_spec(bundle.manifest):
        return [Problem(file, "does not match the bundle's manifest (rebuild the repository)")]
    return []


def _check_meta(root: Path, model_dir: Path, config: Any) -> list[Problem]:
    file = f"{model_dir.name}/{CONFIG_FILE}"
    params, problems = _read(file, model_dir.name, MetaParameters, config)
    if params is None:
        return problems
    bundle_param = params.bundle
    kinds = {
        p.name: "meta" if parse_config_backend(p) == names.META_BACKEND else "model"
        for p in root.iterdir()
        if p.is_dir() and not _hidden(p) and parse_config_backend(p) != names.RUNTIME_BACKEND
    }
    try:
        bundle = check_bundle(model_dir / bundle_param, models=kinds, name=model_dir.name)
    except BundleError as exc:
        rel = f"{model_dir.name}/{bundle_param}"
        return problems + [Problem(f"{rel}/{p.file}", p.message) for p in exc.problems]
    except HloserveError as exc:
        return [*problems, Problem(file, exc.message)]
    if not bundle.manifest.is_meta:
        return [*problems, Problem(file, "backend is hloserve_meta but the bundle is not a meta")]
    built = BuildOptions(**_build_fields(params))
    expected = meta_config(model_dir.name, bundle.manifest, built)
    _same_version_folder(expected, bundle_param)
    return problems + _compare(file, config, expected)


def parse_config_backend(model_dir: Path) -> str | None:
    """The ``backend`` of ``model_dir/config.pbtxt``, or None when it does not parse."""
    try:
        return str(parse_config(model_dir / CONFIG_FILE).backend)
    except HloserveError:
        return None


def _check_runtime(runtime: Any, fronts: dict[str, Bundle | None]) -> list[Problem]:
    file = f"{names.RUNTIME_MODEL}/{CONFIG_FILE}"
    if runtime is None:
        return [Problem(file, "the runtime model is missing")]
    params, problems = _read(file, names.RUNTIME_MODEL, RuntimeParameters, runtime)
    if params is None:
        return problems
    listed = sorted(fronts)
    models = [(n, b.manifest) for n in listed if (b := fronts[n]) is not None]
    if len(models) == len(listed):
        try:  # with the settings it was built with
            expected = runtime_config(models, params)
        except HloserveError as exc:
            return [*problems, Problem(file, f"runtime parameters: {exc.message}")]
        problems += _compare(file, runtime, expected)
    return problems


def _build_fields(params: Any) -> dict[str, Any]:
    """The parameters named like a :class:`BuildOptions` field."""
    built = {f.name for f in dataclasses.fields(BuildOptions)}
    return {f.name: getattr(params, f.name) for f in dataclasses.fields(params) if f.name in built}


def _compare(file: str, actual: Any, expected: Any) -> list[Problem]:
    if actual == expected:
        return []
    diff = difflib.unified_diff(
        config_text(expected).splitlines(),
        config_text(actual).splitlines(),
        "expected",
        "actual",
        lineterm="",
        n=0,
    )
    changed = [line for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    return [
        Problem(
            file,
            "does not match what its bundle gives (rebuild the repository): "
            + "; ".join(changed[:6]),
        )
    ]
