"""Bundles directory -> Triton model repository, validated first and written atomically.

:func:`plan_repository` validates every bundle and computes every config without writing;
:func:`write_repository` writes a plan into a temporary directory next to the target and moves
it into place with one rename (an exchange when the target exists), so a tritonserver polling
the repository sees the old repository or the new one, never a mix.
"""

from __future__ import annotations

import ctypes
import errno
import os
import secrets
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hloserve.bundle import Bundle, BundleError, check_bundle, discover_bundles, load_bundle
from hloserve.bundle.manifest import MANIFEST_FILE, Manifest, parse_manifest
from hloserve.bundle.stablehlo import is_portable_artifact
from hloserve.errors import HloserveError, InvalidArgumentError, Status
from hloserve.model_repository_tools import names
from hloserve.model_repository_tools.batch_sizes import (
    BatchSizeError,
    BatchSizeOptions,
    choose_batch_sizes,
)
from hloserve.model_repository_tools.config import (
    config_text,
    front_config,
    meta_config,
    runtime_config,
)
from hloserve.model_repository_tools.foreign import (
    ForeignModel,
    ForeignModelError,
    is_candidate,
    plan_foreign,
    write_foreign,
)

#: Name of every model's configuration file (Triton's fixed name).
CONFIG_FILE = "config.pbtxt"

#: Receives one human-readable line per step (the CLI prints them).
Progress = Callable[[str], None]


class RepositoryError(InvalidArgumentError):
    """The repository cannot be built as asked (name collision, target exists, no bundles)."""


@dataclass(frozen=True, kw_only=True)
class WeightCacheOptions:
    """The runtime's weight cache settings, written to its config (docs/on_demand_weights.md).

    Attributes:
        weight_cache_bytes: byte budget for all weights (pinned included); 0 (default) = no
            budget, every model's weights stay on the device.
        weight_cache_fraction: instead of bytes, the budget as a fraction in (0, 1] of the
            device memory free at the runtime's start; 0 (default) = unused.
        residency: model name -> ``"system"`` (default), ``"device"`` or ``"unpinned"``.
        compaction_interval: on-demand loads between compactions; 0 (default) = off.
    """

    weight_cache_bytes: int = 0
    weight_cache_fraction: float = 0.0
    residency: Mapping[str, str] = field(default_factory=dict)
    compaction_interval: int = 0


@dataclass(frozen=True, kw_only=True)
class SchedulingOptions:
    """The runtime scheduler's settings, written to its config (docs/scheduling.md).

    Attributes:
        scheduling: ``"fair"`` (default), ``"fifo"`` or ``"edf"``.
        model_weights: model name -> ``fair`` weight (> 0); unlisted models weigh 1.0.
    """

    scheduling: str = names.SCHEDULING_DISCIPLINES[0]
    model_weights: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ExecutableCacheOptions:
    """The runtime's executable cache settings, written to its config (docs/serving.md,
    "Executable cache").

    Attributes:
        directory: the cache directory (absolute) or ``"off"``; "" (default) = the runtime's
            default (``HLOSERVE_EXECUTABLE_CACHE``, else ``$XDG_CACHE_HOME/hloserve/executables``).
        max_bytes: the size bound in bytes; 0 (default) = the runtime's default (4 GiB).
    """

    directory: str = ""
    max_bytes: int = 0


@dataclass(frozen=True)
class FrontModel:
    """One front model (or meta model) of a planned repository.

    Attributes:
        name: model name (the bundle's name).
        source: the bundle directory it is copied from.
        config_text: its ``config.pbtxt``.
        text_executables: executables (paths relative to the bundle) that are MLIR text and get
            converted to portable artifacts in the copy.
        manifest_text: the copy's ``manifest.yaml`` when it differs from the source's (a
            symbolic-batch bundle gets the compiled batch sizes chosen by the build); None =
            copied as it is.
    """

    name: str
    source: Path
    config_text: str
    text_executables: tuple[str, ...]
    manifest_text: str | None = None


@dataclass(frozen=True)
class RepositoryPlan:
    """Everything a repository build writes, computed before anything is written.

    Attributes:
        models: the front models, sorted by name.
        runtime_config_text: the runtime model's ``config.pbtxt``.
        foreign: the Triton models of other backends carried over beside the bundles
            (:mod:`hloserve.model_repository_tools.foreign`), sorted by name.
    """

    models: tuple[FrontModel, ...]
    runtime_config_text: str
    foreign: tuple[ForeignModel, ...] = ()

    @property
    def model_names(self) -> tuple[str, ...]:
        """Front model names, the foreign models' names, then the runtime model's."""
        return (
            *(m.name for m in self.models),
            *(f.name for f in self.foreign),
            names.RUNTIME_MODEL,
        )


def plan_repository(
    bundles_dir: Path | str,
    *,
    front_instances: int = 2,
    max_queue_delay_us: int = 500,
    weight_cache: WeightCacheOptions | None = None,
    meta_concurrency: int = names.DEFAULT_META_CONCURRENCY,
    batch_sizes: BatchSizeOptions | None = None,
    max_request_bytes: int = names.DEFAULT_MAX_REQUEST_BYTES,
    scheduling: SchedulingOptions | None = None,
    progress: Progress | None = None,
    executable_cache: ExecutableCacheOptions | None = None,
) -> RepositoryPlan:
    """Validate every bundle under ``bundles_dir`` and compute the repository; writes nothing.

    Args:
        bundles_dir: directory whose subdirectories holding a ``manifest.yaml`` are bundles.
        front_instances: CPU instances per front model, >= 1.
        max_queue_delay_us: dynamic batcher delay in microseconds, >= 0.
        weight_cache: the runtime's weight cache settings (default: no budget).
        meta_concurrency: the worker's meta gate size (docs/meta_models.md), >= 1.
        batch_sizes: compiled batch sizes of the symbolic-batch bundles
            (:mod:`hloserve.model_repository_tools.batch_sizes`; default: each one's ladder).
        max_request_bytes: the largest request a front accepts, bytes of inputs, >= 1.
        scheduling: the runtime scheduler's settings (default: ``fair``, all weights 1.0).
        progress: called with one line per bundle.
        executable_cache: the runtime's executable cache settings (default: its defaults).

    Raises:
        BundleError: the first invalid bundle (every bundle is checked and reported to
            ``progress`` first), with the validator's message.
        RepositoryError: bad options, no bundles, or colliding names.
    """
    if front_instances < 1:
        raise RepositoryError(f"front instances must be >= 1, got {front_instances}")
    if max_queue_delay_us < 0:
        raise RepositoryError(
            f"max queue delay must be >= 0 microseconds, got {max_queue_delay_us}"
        )
    if meta_concurrency < 1:
        raise RepositoryError(f"meta concurrency must be >= 1, got {meta_concurrency}")
    if max_request_bytes < 1:
        raise RepositoryError(f"max request bytes must be >= 1, got {max_request_bytes}")
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
            _say(progress, f"{path.name}: INVALID ({len(exc.problems)} problem(s))")
            continue
        bundles.append(bundle)
        _say(progress, f"{bundle.name}: valid ({_describe(bundle)})")
    if errors:
        raise errors[0]
    check_names(bundles)
    bundles, rewritten = _with_batch_sizes(bundles, batch_sizes or BatchSizeOptions(), progress)
    models = tuple(
        FrontModel(
            name=b.name,
            source=b.path,
            config_text=config_text(
                meta_config(b.name, b.manifest, meta_concurrency=meta_concurrency)
                if b.manifest.is_meta
                else front_config(
                    b.name,
                    b.manifest,
                    front_instances=front_instances,
                    max_queue_delay_us=max_queue_delay_us,
                    max_request_bytes=max_request_bytes,
                )
            ),
            text_executables=_text_executables(b),
            manifest_text=rewritten.get(b.name),
        )
        for b in bundles
    )
    cache = weight_cache or WeightCacheOptions()
    sched = scheduling or SchedulingOptions()
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
            weight_cache_bytes=cache.weight_cache_bytes,
            weight_cache_fraction=cache.weight_cache_fraction,
            residency=cache.residency,
            compaction_interval=cache.compaction_interval,
            scheduling=sched.scheduling,
            model_weights=sched.model_weights,
            executable_cache=(executable_cache or ExecutableCacheOptions()).directory,
            executable_cache_bytes=(executable_cache or ExecutableCacheOptions()).max_bytes,
            foreign_bytes={f.name: f.memory_bytes for f in foreign},
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
            _say(progress, f"{path.name}: REFUSED ({exc.message})")
            continue
        if model.name == names.RUNTIME_MODEL:
            errors.append(ForeignModelError(f"{path}: a model may not be named {model.name!r}"))
            continue
        planned.append(model)
        layout = "flat, copied into version 1" if model.flat else "version layout"
        _say(progress, f"{model.name}: Triton model, backend {model.backend} ({layout})")
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
        _say(progress, f"{bundle.name}: symbolic batch, compiles batch sizes {list(sizes)}")
    return out, rewritten


def _manifest_with_sizes(manifest: Manifest, sizes: tuple[int, ...]) -> Manifest:
    import yaml

    data = yaml.safe_load(manifest.to_yaml())
    data["batching"]["compiled_batch_sizes"] = list(sizes)
    return parse_manifest(data)


def _check_weight_budget(bundles: Sequence[Bundle], cache: WeightCacheOptions) -> None:
    """Refuse a byte budget some model's weights can never fit (docs/on_demand_weights.md).

    Raises:
        RepositoryError (INVALID_ARGUMENT): every problem, one per line, naming the model, its
            weight bytes and the budget; served, the same models would fail to load.
    """
    from hloserve.triton_backend.weight_cache import budget_problems

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
    """Refuse bundle sets whose model or runtime tensor names collide.

    The runtime's tensor ``<bundle>__<tensor>`` must name exactly one bundle: no two bundles'
    names may both prefix it followed by ``"__"`` (so
    :func:`~hloserve.model_repository_tools.names.split_runtime_tensor_name` is unambiguous).
    A bundle may not be named like the runtime model.

    Raises:
        RepositoryError: listing every collision.
    """
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


def write_repository(
    plan: RepositoryPlan,
    out_dir: Path | str,
    *,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> Path:
    """Write ``plan`` as a model repository at ``out_dir``, atomically.

    The repository is built in ``<out_dir>.tmp-XXXX`` beside ``out_dir``, then renamed into
    place. An existing ``out_dir`` (only with ``overwrite``) is exchanged with the new one in
    one ``renameat2(RENAME_EXCHANGE)`` on Linux (two renames elsewhere) and then deleted.
    Bundle sources are only read.

    Returns:
        The absolute repository path.

    Raises:
        RepositoryError (FAILED_PRECONDITION): ``out_dir`` exists and ``overwrite`` is False,
            or is not a directory, or holds a bundle source.
        ArtifactError: an MLIR text executable does not convert (nothing is left behind).
    """
    out = Path(out_dir).absolute()
    sources = [m.source for m in plan.models] + [f.source for f in plan.foreign]
    _check_target(out, sources, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{out.name}.tmp-", dir=out.parent))
    try:
        _write_tree(plan, tmp, progress)
        tmp.chmod(0o755)  # mkdtemp makes it 0700
        _move_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def build_repository(
    bundles_dir: Path | str,
    out_dir: Path | str,
    *,
    front_instances: int = 2,
    max_queue_delay_us: int = 500,
    weight_cache: WeightCacheOptions | None = None,
    meta_concurrency: int = names.DEFAULT_META_CONCURRENCY,
    batch_sizes: BatchSizeOptions | None = None,
    max_request_bytes: int = names.DEFAULT_MAX_REQUEST_BYTES,
    scheduling: SchedulingOptions | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
    executable_cache: ExecutableCacheOptions | None = None,
) -> RepositoryPlan:
    """Validate the bundles under ``bundles_dir`` and write their repository at ``out_dir``.

    :func:`plan_repository` then :func:`write_repository`; nothing is written unless every
    bundle is valid and the names do not collide.

    Returns:
        The plan that was written.

    Raises:
        BundleError, RepositoryError: see :func:`plan_repository` and :func:`write_repository`.
    """
    out = Path(out_dir).absolute()
    _check_target(out, [], overwrite)  # fail before validating when the answer is known
    plan = plan_repository(
        bundles_dir,
        front_instances=front_instances,
        max_queue_delay_us=max_queue_delay_us,
        weight_cache=weight_cache,
        meta_concurrency=meta_concurrency,
        batch_sizes=batch_sizes,
        max_request_bytes=max_request_bytes,
        scheduling=scheduling,
        progress=progress,
        executable_cache=executable_cache,
    )
    write_repository(plan, out, overwrite=overwrite, progress=progress)
    return plan


def _say(progress: Progress | None, line: str) -> None:
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


def _check_target(out: Path, sources: Sequence[Path], overwrite: bool) -> None:
    if out.exists() or out.is_symlink():
        if not overwrite:
            raise RepositoryError(
                f"{out} exists; to replace it, build with overwrite on "
                "(`hloserve repo build --overwrite`)",
                status=Status.FAILED_PRECONDITION,
            )
        if out.is_symlink() or not out.is_dir():
            raise RepositoryError(
                f"{out} exists and is not a directory; refusing to replace it",
                status=Status.FAILED_PRECONDITION,
            )
    for source in sources:
        resolved = source.resolve()
        if resolved == out.resolve() or out.resolve() in resolved.parents:
            raise RepositoryError(
                f"{out} holds the bundle {source}; write the repository somewhere else",
                status=Status.FAILED_PRECONDITION,
            )


def _ignore(_dir: str, entries: list[str]) -> list[str]:
    """Leave editor/temp files and caches out of bundle copies."""
    return [e for e in entries if e.startswith(".") or e == "__pycache__"]


def _write_tree(plan: RepositoryPlan, root: Path, progress: Progress | None) -> None:
    from hloserve.bundle.convert import convert_bundle

    for model in plan.models:
        model_dir = root / model.name
        bundle_copy = model_dir / names.BUNDLE_SUBDIR
        bundle_copy.parent.mkdir(parents=True)
        shutil.copytree(model.source, bundle_copy, ignore=_ignore)
        line = f"{model.name}: copied to {model.name}/{names.BUNDLE_SUBDIR}"
        if model.manifest_text is not None:
            (bundle_copy / MANIFEST_FILE).write_text(model.manifest_text)
            # every chosen size must specialize (the artifact's own shape assertions)
            check_bundle(bundle_copy, name=model.name)
        if model.text_executables:
            converted = convert_bundle(bundle_copy)
            check_bundle(
                bundle_copy, name=model.name
            )  # the converted copy must still match the manifest
            line += f"; converted {', '.join(converted)} to portable artifacts"
        (model_dir / CONFIG_FILE).write_text(model.config_text)
        _say(progress, line)
    for foreign in plan.foreign:
        write_foreign(foreign, root / foreign.name)
        _say(progress, f"{foreign.name}: copied ({foreign.backend})")
    runtime_dir = root / names.RUNTIME_MODEL
    (runtime_dir / names.MODEL_VERSION).mkdir(parents=True)
    (runtime_dir / CONFIG_FILE).write_text(plan.runtime_config_text)


def _move_into_place(new: Path, out: Path) -> None:
    """Put ``new`` at ``out``; an existing ``out`` ends up deleted."""
    if not out.exists():
        os.rename(new, out)
        return
    if _exchange(new, out):
        shutil.rmtree(new)  # now the old repository
        return
    old = out.with_name(f"{out.name}.old-{secrets.token_hex(4)}")
    os.rename(out, old)
    try:
        os.rename(new, out)
    except BaseException:
        os.rename(old, out)
        raise
    shutil.rmtree(old)


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2  # linux/fs.h


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths with Linux ``renameat2(RENAME_EXCHANGE)`` (glibc >= 2.28).

    Returns:
        False when the platform or file system cannot (the caller falls back to renames).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    renameat2.restype = ctypes.c_int
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))
