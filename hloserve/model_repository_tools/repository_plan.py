"""Bundles directory -> a validated plan of the Triton model repository, nothing written
(:func:`plan_repository`; docs/serving.md, "The generated model repository").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hloserve import names
from hloserve.bundle.bundle import Bundle, discover_bundles, load_bundle
from hloserve.bundle.manifest import Manifest, parse_manifest
from hloserve.bundle.stablehlo import is_portable_artifact
from hloserve.bundle.validate import check_bundle
from hloserve.errors import (
    BatchSizeError,
    BundleError,
    ForeignModelError,
    HloserveError,
    InvalidArgumentError,
    RepositoryError,
)
from hloserve.model_parameters import RuntimeParameters
from hloserve.model_repository_tools.batch_sizes import choose_batch_sizes
from hloserve.model_repository_tools.build_options import (
    BatchSizeOptions,
    BuildOptions,
    WeightCacheOptions,
)
from hloserve.model_repository_tools.config import (
    config_text,
    front_config,
    meta_config,
    runtime_config,
)
from hloserve.model_repository_tools.foreign import ForeignModel, is_candidate, plan_foreign

#: Receives one human-readable line per step (the CLI prints them).
Progress = Callable[[str], None]


@dataclass(frozen=True)
class FrontModel:
    """One front model (or meta model) of a planned repository: ``text_executables`` are the
    MLIR text executables (bundle-relative) converted in the copy; ``manifest_text`` the copy's
    ``manifest.yaml`` when it differs from the source's (chosen batch sizes), else None."""

    name: str
    source: Path
    config_text: str
    text_executables: tuple[str, ...]
    manifest_text: str | None = None


@dataclass(frozen=True)
class RepositoryPlan:
    """Everything a repository build writes; ``models`` and ``foreign`` sorted by name."""

    models: tuple[FrontModel, ...]
    runtime_config_text: str
    foreign: tuple[ForeignModel, ...] = ()


def plan_repository(
    bundles_dir: Path | str,
    options: BuildOptions | None = None,
    *,
    progress: Progress | None = None,
    **fields: Any,
) -> RepositoryPlan:
    """Validate every bundle under ``bundles_dir`` and compute the repository; writes nothing.

    ``fields`` replace those of ``options`` (``plan_repository(path, front_instances=1)``);
    ``progress`` gets one line per bundle.

    Raises:
        BundleError: the first invalid bundle (all are reported to ``progress`` first).
        RepositoryError: bad options, no bundles, or colliding names.
    """
    options = replace(options or BuildOptions(), **fields)
    options.check()
    paths = discover_bundles(bundles_dir)
    foreign_paths = sorted(
        p for p in Path(bundles_dir).iterdir() if is_candidate(p) and p not in paths
    )
    if not paths and not foreign_paths:
        raise RepositoryError(
            f"{bundles_dir}: no bundles and no Triton models (no subdirectory holds a "
            "manifest.yaml or a Triton model)"
        )
    foreign = _plan_foreign(foreign_paths, progress)
    kinds = {**_kinds(paths), **{f.name: "foreign" for f in foreign}}
    bundles: list[Bundle] = []
    errors: list[BundleError] = []
    for path in paths:
        try:
            bundle = check_bundle(path, models=kinds)
        except BundleError as exc:
            errors.append(exc)
            report(progress, f"{path.name}: INVALID ({len(exc.problems)} problem(s))")
            continue
        bundles.append(bundle)
        report(progress, f"{bundle.name}: valid ({_describe(bundle)})")
    if errors:
        raise errors[0]
    check_names(bundles)
    options.queue.check([b.name for b in bundles if not b.manifest.is_meta])
    bundles, rewritten = _with_batch_sizes(bundles, options.batch_sizes, progress)
    models = tuple(
        FrontModel(
            name=b.name,
            source=b.path,
            config_text=config_text(
                meta_config(b.name, b.manifest, options)
                if b.manifest.is_meta
                else front_config(b.name, b.manifest, options)
            ),
            text_executables=_text_executables(b),
            manifest_text=rewritten.get(b.name),
        )
        for b in bundles
    )
    cache = options.weight_cache
    metas = sorted(set(cache.residency) & {b.name for b in bundles if b.manifest.is_meta})
    if metas:
        raise RepositoryError(
            "; ".join(
                f"residency for {n!r}: {n!r} is a meta model: it has no weights" for n in metas
            )
            + " (residency applies to the bundles with weights: "
            + f"{sorted(b.name for b in bundles if not b.manifest.is_meta)})"
        )
    try:
        runtime = runtime_config(
            [(b.name, b.manifest) for b in bundles if not b.manifest.is_meta],
            RuntimeParameters(
                **options.runtime_settings(),
                foreign_bytes={f.name: f.memory_bytes for f in foreign},
            ),
        )
    except InvalidArgumentError as exc:
        raise RepositoryError(exc.message) from None
    if cache.weight_cache_bytes > 0:
        _check_weight_budget(bundles, cache)
    return RepositoryPlan(models, config_text(runtime), foreign)


def _plan_foreign(paths: Sequence[Path], progress: Progress | None) -> tuple[ForeignModel, ...]:
    """Plan every foreign folder; report each, then raise the first refusal."""
    planned, errors = [], []
    for path in paths:
        try:
            model = plan_foreign(path)
        except ForeignModelError as exc:
            errors.append(exc)
            report(progress, f"{path.name}: REFUSED ({exc.message})")
            continue
        if model.name == names.RUNTIME_MODEL:
            errors.append(ForeignModelError(f"{path}: a model may not be named {model.name!r}"))
            continue
        planned.append(model)
        layout = "flat, copied into version 1" if model.flat else "version layout"
        report(progress, f"{model.name}: Triton model, backend {model.backend} ({layout})")
    if errors:
        raise RepositoryError(errors[0].message)
    return tuple(planned)


def _with_batch_sizes(
    bundles: list[Bundle], options: BatchSizeOptions, progress: Progress | None
) -> tuple[list[Bundle], dict[str, str]]:
    """Symbolic-batch bundles with their chosen compiled sizes, and their copies' manifests."""
    try:
        chosen = choose_batch_sizes(
            {b.name: b.manifest for b in bundles if not b.manifest.is_meta}, options
        )
    except BatchSizeError as exc:
        raise RepositoryError(exc.message) from None
    out, rewritten = [], {}
    for bundle in bundles:
        sizes = chosen.get(bundle.name)
        if sizes is None:
            out.append(bundle)
            continue
        manifest = _manifest_with_sizes(bundle.manifest, sizes)
        rewritten[bundle.name] = manifest.to_yaml()
        out.append(Bundle(bundle.path, manifest, bundle.model_name))
        report(progress, f"{bundle.name}: symbolic batch, compiles batch sizes {list(sizes)}")
    return out, rewritten


def _manifest_with_sizes(manifest: Manifest, sizes: tuple[int, ...]) -> Manifest:
    import yaml

    data = yaml.safe_load(manifest.to_yaml())
    data["batching"]["compiled_batch_sizes"] = list(sizes)
    return parse_manifest(data)


def _check_weight_budget(bundles: Sequence[Bundle], cache: WeightCacheOptions) -> None:
    """RepositoryError for each model whose weights can never fit the byte budget."""
    from hloserve.triton_backend.runtime.residency import budget_problems

    weights = {b.name: b.weight_nbytes for b in bundles if not b.manifest.is_meta}
    problems = budget_problems(cache.weight_cache_bytes, weights, cache.residency)
    if problems:
        raise RepositoryError(
            "; ".join(problems)
            + ": raise the weight cache budget, change the residency, or serve the model elsewhere"
        )


def _kinds(paths: Sequence[Path]) -> dict[str, str]:
    """Model name -> manifest kind of every bundle whose manifest loads (for meta.calls)."""
    kinds: dict[str, str] = {}
    for path in paths:
        try:
            kinds[path.name] = load_bundle(path).manifest.kind
        except HloserveError:
            continue  # reported by check_bundle
    return kinds


def check_names(bundles: Sequence[Bundle]) -> None:
    """RepositoryError listing every collision: two bundles of one name, one named like the
    runtime model, a runtime tensor ``<bundle>__<tensor>`` that reads as another bundle's."""
    problems = []
    seen: set[str] = set()
    for bundle in bundles:
        if bundle.name == names.RUNTIME_MODEL:
            problems.append(
                f"bundle {bundle.name!r} ({bundle.path}) has the runtime model's name; rename it"
            )
        if bundle.name in seen:
            problems.append(f"two bundles are named {bundle.name!r}")
        seen.add(bundle.name)
    for bundle in bundles:
        for spec in (*bundle.manifest.inputs, *bundle.manifest.outputs):
            name = names.runtime_tensor_name(bundle.name, spec.name)
            others = sorted(
                b
                for b in seen
                if b != bundle.name and name.startswith(b + names.NAMESPACE_SEPARATOR)
            )
            for other in others:
                rest = name[len(other) + len(names.NAMESPACE_SEPARATOR) :]
                problems.append(
                    f"runtime tensor name {name!r} is ambiguous: it is tensor {spec.name!r} of "
                    f"model {bundle.name!r} and reads as tensor {rest!r} of model {other!r}; "
                    f"rename a bundle (no bundle name may start with another bundle's name "
                    f"followed by {names.NAMESPACE_SEPARATOR!r})"
                )
    if problems:
        raise RepositoryError("name collision:\n" + "\n".join(f"  {p}" for p in problems))


def report(progress: Progress | None, line: str) -> None:
    """Hand ``line`` to ``progress`` (nothing when None)."""
    if progress is not None:
        progress(line)


def _describe(bundle: Bundle) -> str:
    manifest = bundle.manifest
    if manifest.is_meta:
        calls = ", ".join(manifest.calls) or "nothing (compute-only)"
        return (
            f"meta, {len(manifest.wire_inputs)} input(s), {len(manifest.wire_outputs)} "
            f"output(s), calls {calls}"
        )
    sizes = manifest.batching.compiled_batch_sizes
    batching = f"batch sizes {', '.join(map(str, sizes))}" if sizes else "unbatched"
    if manifest.is_symbolic:
        batching = "symbolic batch"
    if sizes and not manifest.batch_leading:
        batching += ", batch axis not leading: max_batch_size 0"
    if manifest.variants:
        shapes = " | ".join(
            ", ".join(f"{a}={n}" for a, n in dims.items()) for dims in manifest.variant_dims
        )
        batching += f", variants {shapes}"
    return f"{len(manifest.inputs)} input(s), {len(manifest.outputs)} output(s), {batching}"


def _text_executables(bundle: Bundle) -> tuple[str, ...]:
    return tuple(
        file
        for _, file in sorted(bundle.manifest.all_executables.items())
        if not is_portable_artifact((bundle.path / file).read_bytes())
    )
