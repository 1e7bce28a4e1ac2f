"""Implementation of :func:`export_bundle`."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

import hloserve
from hloserve.bundle import dtypes
from hloserve.bundle.bundle import Bundle, load_bundle
from hloserve.bundle.manifest import (
    FORMAT_VERSION,
    MANIFEST_FILE,
    META_FORMAT_VERSION,
    STATE_FORMAT_VERSION,
    SYMBOLIC_FORMAT_VERSION,
    UNBATCHED,
    Manifest,
)
from hloserve.bundle.manifest_sections import (
    SYMBOLIC,
    Batching,
    ClientTensorSpec,
    Sequencing,
    StateSpec,
    SymbolicBatch,
    TensorSpec,
    Variant,
    Variants,
    Weights,
    repeated,
)
from hloserve.bundle.notation import BATCH_LETTERS, VARIABLE
from hloserve.bundle.stablehlo import default_target_version, strip_locations, to_portable_artifact
from hloserve.bundle.validate import check_bundle
from hloserve.errors import ExportError, InvalidArgumentError

log = logging.getLogger("hloserve.export")

WEIGHTS_FILE = "weights.safetensors"


@dataclass(frozen=True)
class OutputSpec:
    """A named output and its shape letters (e.g. ``"nk"``); sizes and dtype come from tracing."""

    name: str
    shape: str


def weight_names(params: Any) -> list[str]:
    """Names of a params pytree's leaves in flattening order: ``{"conv1": {"kernel": w}}`` ->
    ``"conv1.kernel"``; a bare array is ``"params"``; raises ExportError: two leaves get one
    name."""
    import jax

    leaves, _ = jax.tree_util.tree_flatten_with_path(params)
    keystr = jax.tree_util.keystr
    names = [keystr(path, simple=True, separator=".") or "params" for path, _ in leaves]
    if dup := repeated(names):
        raise ExportError(f"params flatten to repeated weight names {dup}; use distinct keys")
    return names


@contextlib.contextmanager
def _x64(enabled: bool) -> Iterator[None]:
    """JAX's 64-bit mode while exporting (restored afterwards)."""
    import jax

    switch = enabled and not jax.config.read("jax_enable_x64")
    if switch:
        jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        if switch:
            jax.config.update("jax_enable_x64", False)


def export_bundle(
    fn: Callable[..., Any],
    params: Any,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[OutputSpec],
    batch_sizes: Sequence[int] | Literal["symbolic"],
    out_dir: Path | str,
    *,
    overwrite: bool = False,
    batch_min: int = 1,
    batch_max: int | None = None,
    debug_locations: bool | None = None,
    stablehlo_target: str | None = None,
    variants: Sequence[Mapping[str, int]] = (),
    client_inputs: Sequence[ClientTensorSpec] | None = None,
    client_outputs: Sequence[ClientTensorSpec] | None = None,
    files: Mapping[str, Path | str] | None = None,
    progress: Callable[[str], None] | None = None,
    state: Sequence[StateSpec] = (),
    sequence: Sequencing | None = None,
) -> Bundle:
    """Export ``fn(params, *inputs)`` as a validated bundle: one portable artifact per batch
    size (docs/bundles.md, "Exporting from JAX", shows each argument in use).

    Args:
        fn: JAX-traceable; returns one array, a tuple/list in ``outputs`` order, or a dict
            by output name.
        params: a pytree of arrays; its leaves become the weights (:func:`weight_names`),
            the leading arguments of ``main``.
        batch_sizes: e.g. ``[1, 8, 32]``; empty when unbatched; ``"symbolic"``: one artifact
            per variant for sizes ``batch_min`` to ``batch_max`` (None: unbounded).
        out_dir: the bundle directory; its name is the model name.
        debug_locations: keep MLIR ``loc`` (default: except with ``"symbolic"``).
        variants: sizes of the variable input axes (``-1`` in ``dims``), e.g.
            ``[{"s": 32}, {"s": 128}]``; each is compiled at every batch size.
        files: extra files copied in, by name in the bundle (e.g. ``{"model.py": path}``).
        progress: called with one line per executable written (seconds it took).

    Raises:
        ExportError: out_dir exists (without ``overwrite``), an output's rank or batch axis
            differs from its spec, or a weight has an unsupported dtype.
        BundleError: the written bundle fails validation (nothing is left at ``out_dir``).
    """
    import jax
    import jaxlib
    from jax import export as jax_export

    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise ExportError(f"{out_dir} exists; pass overwrite=True to replace it")
    leaves, treedef = jax.tree_util.tree_flatten(params)
    names = weight_names(params)
    host_weights = [np.asarray(leaf) for leaf in leaves]
    for name, array in zip(names, host_weights, strict=True):
        try:
            dtypes.from_numpy(array.dtype)
        except InvalidArgumentError:
            raise ExportError(f"weight {name!r} has unsupported dtype {array.dtype}") from None
    input_dtypes = [spec.dtype_info.numpy for spec in inputs]
    wide = any(d.itemsize == 8 for d in [*input_dtypes, *(w.dtype for w in host_weights)])
    symbolic = None
    if isinstance(batch_sizes, str):
        if batch_sizes != "symbolic":
            raise ExportError(
                f"batch_sizes must be a list of sizes or 'symbolic', got {batch_sizes!r}"
            )
        try:
            symbolic = SymbolicBatch(min=batch_min, max=batch_max)
        except ValueError as exc:
            raise ExportError(f"symbolic batch: {exc}") from None
        if not all(spec.batch_axis is not None for spec in inputs):
            raise ExportError(
                "batch_sizes='symbolic' needs a batch axis ('n' or 'b') on every input"
            )
    elif batch_min != 1 or batch_max is not None:
        raise ExportError("batch_min/batch_max apply only with batch_sizes='symbolic'")
    sizes: list[int | None] = [None]
    if not isinstance(batch_sizes, str):
        sizes = [*sorted(set(batch_sizes))] or [UNBATCHED]
    n_weights = len(host_weights)
    shapes = [dict(v) for v in variants] or [{}]
    variable = sorted({a for spec in inputs for a in spec.variable_axes})
    if [sorted(v) for v in shapes if sorted(v) != variable]:
        raise ExportError(
            f"variants {shapes} must each give a size for exactly the variable input axes "
            f"{variable} (inputs with -1 in dims)"
        )

    def main(*args: Any) -> tuple[Any, ...]:
        result = fn(jax.tree_util.tree_unflatten(treedef, args[:n_weights]), *args[n_weights:])
        return _as_tuple(result, outputs)

    target = stablehlo_target or default_target_version()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    staging = scratch / out_dir.name  # validated under the real model name, then moved in place
    staging.mkdir()
    try:
        with _x64(wide):
            weight_structs = [jax.ShapeDtypeStruct(w.shape, w.dtype) for w in host_weights]
            executables: list[dict[int, str]] = [{} for _ in shapes]
            out_specs: list[TensorSpec] | None = None
            jobs = [(v, size) for v in range(len(shapes)) for size in sizes]
            batch_dim = _symbolic_batch(symbolic) if symbolic else None
            for i, (v, size) in enumerate(jobs, 1):
                what = "symbolic batch" if size is None else f"batch size {size}"
                what += f", variant {shapes[v]}" if variants else ""
                log.info("exporting %s: %s (%d/%d)", out_dir.name, what, i, len(jobs))
                started = time.perf_counter()
                in_structs = [
                    jax.ShapeDtypeStruct(_input_shape(spec, size, shapes[v], batch_dim), dt)
                    for spec, dt in zip(inputs, input_dtypes, strict=True)
                ]
                exported = jax_export.export(jax.jit(main, keep_unused=True))(
                    *weight_structs, *in_structs
                )
                specs = _output_specs(outputs, exported.out_avals, size, shapes[v])
                if out_specs is not None and specs != out_specs:
                    raise ExportError(
                        f"outputs differ between batch sizes or variants: {out_specs} vs "
                        f"{specs} at batch size {size}, variant {shapes[v]}"
                    )
                out_specs = specs
                tag = "".join(f"{a}{n}." for a, n in sorted(shapes[v].items()))
                tag += "symbolic." if size is None else f"b{size}." if size else ""
                file = f"model.{tag}mlirbc"
                text = exported.mlir_module()
                keep = debug_locations if debug_locations is not None else symbolic is None
                artifact = to_portable_artifact(text if keep else strip_locations(text), target)
                (staging / file).write_bytes(artifact)
                executables[v][SYMBOLIC if size is None else size] = file
                if progress is not None:
                    progress(f"{what}: {time.perf_counter() - started:.1f} s ({i}/{len(jobs)})")
        assert out_specs is not None  # sizes is never empty
        for name, source in (files or {}).items():
            shutil.copyfile(source, staging / name)
        weights = _write_weights(staging, names, host_weights)
        extra: dict[str, Any] = {}
        if variants:
            extra["variants"] = Variants(
                shapes=[
                    Variant(dims=d, executables=e) for d, e in zip(shapes, executables, strict=True)
                ]
            )
        if client_inputs is not None:
            extra["client_inputs"] = list(client_inputs)
        if client_outputs is not None:
            extra["client_outputs"] = list(client_outputs)
        version = META_FORMAT_VERSION if extra else FORMAT_VERSION
        if state:
            extra["state"] = list(state)
            if sequence is not None:
                extra["sequence"] = sequence
            version = STATE_FORMAT_VERSION
        manifest = Manifest(
            format_version=max(SYMBOLIC_FORMAT_VERSION if symbolic else 0, version),
            kind="model",
            inputs=list(inputs),
            outputs=out_specs,
            batching=Batching(compiled_batch_sizes=[s for s in sizes if s], symbolic=symbolic),
            executables={} if variants else executables[0],
            weights=weights,
            **extra,
            producer={
                "tool": "hloserve.export",
                "hloserve": hloserve.__version__,
                "jax": jax.__version__,
                "jaxlib": jaxlib.__version__,
                "stablehlo_target": target,
            },
        )
        (staging / MANIFEST_FILE).write_text(manifest.to_yaml())  # last: marks the bundle complete
        check_bundle(staging)
        for written in staging.iterdir():  # tempfile and safetensors create owner-only files
            written.chmod(0o644)
        staging.chmod(0o755)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
        log.info("wrote bundle %s (%d executables)", out_dir, len(jobs))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return load_bundle(out_dir)


def _symbolic_batch(symbolic: SymbolicBatch) -> Any:
    from jax import export as jax_export

    constraints = [f"b >= {symbolic.min}"] if symbolic.min > 1 else []
    if symbolic.max is not None:
        constraints.append(f"b <= {symbolic.max}")
    (dim,) = jax_export.symbolic_shape("b", constraints=constraints)
    return dim


def _input_shape(
    spec: TensorSpec, size: int | None, variant: Mapping[str, int], batch_dim: Any
) -> tuple[Any, ...]:
    """An input's export shape: ``batch_dim`` (symbolic) at the batch axis when size is None."""
    shape: tuple[Any, ...] = spec.shape_at(size or 0, variant)
    if size is None:
        shape = tuple(batch_dim if i == spec.batch_axis else d for i, d in enumerate(shape))
    return shape


def _as_tuple(result: Any, outputs: Sequence[OutputSpec]) -> tuple[Any, ...]:
    if isinstance(result, Mapping):
        missing = [o.name for o in outputs if o.name not in result]
        if missing:
            raise ExportError(f"fn returned a dict without outputs {missing}")
        return tuple(result[o.name] for o in outputs)
    values = tuple(result) if isinstance(result, (tuple, list)) else (result,)
    if len(values) != len(outputs):
        raise ExportError(
            f"fn returned {len(values)} arrays, but {len(outputs)} outputs are declared"
        )
    return values


def _output_specs(
    outputs: Sequence[OutputSpec], avals: Sequence[Any], size: int | None, variant: dict[str, int]
) -> list[TensorSpec]:
    """Output specs from the traced shapes (size None: symbolic batch ``b``); variant axes -1."""
    specs = []
    for out, aval in zip(outputs, avals, strict=True):
        shape = tuple(d if isinstance(d, int) else str(d) for d in aval.shape)
        if len(shape) != len(out.shape):
            raise ExportError(
                f"output {out.name!r}: shape letters {out.shape!r} have rank {len(out.shape)}, "
                f"fn returns shape {shape}"
            )
        dims = {}
        for letter, dim in zip(out.shape, shape, strict=True):
            if letter in BATCH_LETTERS:
                if dim != (size if size is not None else "b"):
                    raise ExportError(
                        f"output {out.name!r}: batch axis {letter!r} has size {dim} "
                        f"at batch size {size}"
                    )
            elif letter in variant:
                if dim != variant[letter]:
                    raise ExportError(
                        f"output {out.name!r}: axis {letter!r} has size {dim}, but the "
                        f"variant {variant} makes it {variant[letter]}"
                    )
                dims[letter] = VARIABLE
            elif isinstance(dim, str):
                raise ExportError(
                    f"output {out.name!r}: axis {letter!r} has the symbolic size {dim}; only "
                    "the batch axis may follow the symbolic batch"
                )
            else:
                dims[letter] = dim
        try:
            token = dtypes.from_numpy(aval.dtype).token
        except InvalidArgumentError:
            raise ExportError(f"output {out.name!r}: unsupported dtype {aval.dtype}") from None
        specs.append(TensorSpec(name=out.name, dtype=token, shape=out.shape, dims=dims))
    return specs


def _write_weights(staging: Path, names: list[str], arrays: list[np.ndarray]) -> Weights:
    if not names:
        return Weights()
    from safetensors.numpy import save_file

    save_file(
        # np.ascontiguousarray would turn a 0-d weight (a step counter) into shape (1,)
        {n: np.require(a, requirements="C") for n, a in zip(names, arrays, strict=True)},
        str(staging / WEIGHTS_FILE),
        metadata={"producer": "hloserve.export"},
    )
    return Weights(file=WEIGHTS_FILE, order=names)
