"""StableHLO artifacts: recognize, convert text to portable, read ``main``, specialize a batch.

The one place that touches MLIR, through ``jax.extend.mlir``. Portable artifacts (VHLO bytecode)
are read by StableHLO releases up to 5 years newer and 2 older (openxla/stablehlo
``docs/compatibility.md``); MLIR text has no such guarantee.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from hloserve.bundle import dtypes
from hloserve.errors import ArtifactError, InvalidArgumentError

#: MLIR bytecode magic ("ML\xefR"); portable artifacts are MLIR bytecode.
MLIR_BYTECODE_MAGIC = b"ML\xefR"
#: Producer string StableHLO writes into a portable artifact right after the magic.
_PORTABLE_PRODUCER = b"StableHLO_v"


@dataclass(frozen=True)
class TensorType:
    """A ranked tensor type: row-major sizes (None: dynamic), StableHLO element type."""

    shape: tuple[int | None, ...]
    element_type: str

    @property
    def dtype_token(self) -> str | None:
        """The manifest dtype token, or None for an element type outside the table."""
        try:
            return dtypes.from_stablehlo(self.element_type).token
        except InvalidArgumentError:
            return None

    def __str__(self) -> str:
        dims = "x".join("?" if d is None else str(d) for d in self.shape)
        return f"tensor<{dims + 'x' if dims else ''}{self.element_type}>"


@dataclass(frozen=True)
class Signature:
    """The argument and result types of a module's ``main``."""

    inputs: tuple[TensorType, ...]
    outputs: tuple[TensorType, ...]


def is_portable_artifact(data: bytes) -> bool:
    """Whether ``data`` is a StableHLO portable artifact (VHLO bytecode written by StableHLO)."""
    return data.startswith(MLIR_BYTECODE_MAGIC) and _PORTABLE_PRODUCER in data[4:40]


@cache
def _mlir() -> Any:
    import jax.extend.mlir as mlir_ext
    from jax.extend.mlir import ir
    from jax.extend.mlir.dialects import stablehlo

    return mlir_ext, ir, stablehlo


def default_target_version() -> str:
    """StableHLO version artifacts are written for: ``StablehloCompatibilityRequirement.MAX``."""
    _, _, stablehlo = _mlir()
    return str(
        stablehlo.get_version_from_compatibility_requirement(
            stablehlo.StablehloCompatibilityRequirement.MAX
        )
    )


def to_portable_artifact(module: bytes | str, target_version: str | None = None) -> bytes:
    """Convert MLIR text or bytecode to a portable artifact (an artifact is returned as is).

    ``target_version`` e.g. ``"1.0.0"``; default :func:`default_target_version`.

    Raises:
        ArtifactError: the module does not parse, or uses ops newer than the target.
    """
    if isinstance(module, bytes) and is_portable_artifact(module):
        return module
    mlir_ext, _, _ = _mlir()
    target = target_version or default_target_version()
    try:
        return bytes(mlir_ext.serialize_portable_artifact(module, target))
    except Exception as exc:  # the bindings raise a bare Exception/ValueError with MLIR text
        raise ArtifactError(
            f"cannot serialize StableHLO to a portable artifact for target {target}: {exc}"
        ) from None


def module_text(data: bytes) -> str:
    """StableHLO MLIR text of a portable artifact (or of MLIR text bytes, decoded); raises
    ArtifactError: neither a portable artifact nor UTF-8 text."""
    from jax._src.interpreters import mlir as jax_mlir

    with jax_mlir.make_ir_context():  # newer bindings take the context from the `with`
        return _module_text(data)


def _parse(ir: Any, ctx: Any, text: str) -> Any:
    try:
        return ir.Module.parse(text, context=ctx)
    except Exception as exc:
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise ArtifactError(f"MLIR does not parse: {detail[:400]}") from None


def _function(ir: Any, module: Any, name: str) -> Any:
    for op in module.body.operations:
        if "sym_name" in op.attributes and ir.StringAttr(op.attributes["sym_name"]).value == name:
            return op
    raise ArtifactError(f"module has no function named {name!r}")


def _module_text(data: bytes) -> str:
    if is_portable_artifact(data):
        mlir_ext, _, _ = _mlir()
        try:
            return str(mlir_ext.deserialize_portable_artifact(data))
        except Exception as exc:
            raise ArtifactError(f"cannot deserialize portable artifact: {exc}") from None
    if data.startswith(MLIR_BYTECODE_MAGIC):
        raise ArtifactError(
            "MLIR bytecode that is not a StableHLO portable artifact; write it with "
            "stablehlo.serialize_portable_artifact or give MLIR text"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ArtifactError("neither a portable artifact nor UTF-8 MLIR text") from None


def read_signature(data: bytes, function: str = "main") -> Signature:
    """The argument and result types of ``function`` in a portable artifact or MLIR text; raises
    ArtifactError: the module does not parse, has no such function, or has a non-tensor argument or
    result (a token, a tuple)."""
    _, ir, _ = _mlir()
    from jax._src.interpreters import mlir as jax_mlir  # the context with every dialect loaded

    with jax_mlir.make_ir_context() as ctx:
        module = _parse(ir, ctx, _module_text(data))  # keep alive: op refers into it
        op = _function(ir, module, function)
        fn_type = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
        inputs, outputs = (
            tuple(_tensor_type(ir, t, f"{what} {i}") for i, t in enumerate(types))
            for what, types in (("argument", fn_type.inputs), ("result", fn_type.results))
        )
        return Signature(inputs, outputs)


def _tensor_type(ir: Any, mlir_type: Any, what: str) -> TensorType:
    try:
        ranked = ir.RankedTensorType(mlir_type)  # raises ValueError for any other type
    except ValueError:
        raise ArtifactError(
            f"{what} of main has type {mlir_type}, expected a ranked tensor"
        ) from None
    shape = tuple(
        None if ranked.is_dynamic_dim(i) else int(ranked.get_dim_size(i))
        for i in range(ranked.rank)
    )
    element = str(ranked.element_type)
    if element.startswith("si"):  # signless vs signed spelling: si32 means i32 here
        element = element[1:]
    return TensorType(shape, element)


_SYMBOLIC_MAIN = "_hloserve_symbolic_main"


def specialize_batch(data: bytes, batch_size: int, target_version: str | None = None) -> bytes:
    """A portable artifact of ``data`` whose dynamic (``?``) sizes are all ``batch_size``.

    As ``jax.export`` calls at concrete shapes: a new ``main`` converts to the dynamic types and
    calls the old one, then ``refine_polymorphic_shapes`` propagates the static shapes and
    checks the module's shape assertions (docs/bundles.md, "Symbolic batch").

    Raises:
        ArtifactError: the module does not parse or has no ``main``; or ``batch_size`` breaks
            a shape assertion (the message says which).
    """
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib.mlir.dialects import func as func_dialect
    from jax._src.lib.mlir.dialects import hlo

    _, ir, _ = _mlir()
    with jax_mlir.make_ir_context() as ctx, ir.Location.unknown():
        module = _parse(ir, ctx, _module_text(data))
        main = _function(ir, module, "main")
        fn_type = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)

        def static(mlir_type: Any) -> Any:
            ranked = ir.RankedTensorType(mlir_type)
            shape = [
                batch_size if ranked.is_dynamic_dim(i) else ranked.get_dim_size(i)
                for i in range(ranked.rank)
            ]
            return ir.RankedTensorType.get(shape, ranked.element_type)

        arg_types = [static(t) for t in fn_type.inputs]
        result_types = [static(t) for t in fn_type.results]
        main.attributes["sym_name"] = ir.StringAttr.get(_SYMBOLIC_MAIN)
        main.attributes["sym_visibility"] = ir.StringAttr.get("private")
        with ir.InsertionPoint(module.body):
            wrapper = func_dialect.FuncOp("main", ir.FunctionType.get(arg_types, result_types))
            wrapper.attributes["sym_visibility"] = ir.StringAttr.get("public")
            entry = wrapper.add_entry_block()
            with ir.InsertionPoint(entry):
                args = [
                    a if a.type == t else hlo.ConvertOp(t, a).result
                    for a, t in zip(entry.arguments, fn_type.inputs, strict=True)
                ]
                call = func_dialect.CallOp(
                    list(fn_type.results), ir.FlatSymbolRefAttr.get(_SYMBOLIC_MAIN), args
                )
                func_dialect.ReturnOp(
                    [
                        r if r.type == t else hlo.ConvertOp(t, r).result
                        for r, t in zip(call.results, result_types, strict=True)
                    ]
                )
        mlir_ext, _, _ = _mlir()
        try:
            refined = mlir_ext.refine_polymorphic_shapes(
                str(module).encode(), enable_shape_assertions=True, validate_static_shapes=True
            )
        except Exception as exc:  # the bindings raise a bare Exception with XLA's text
            detail = " ".join(str(exc).split()) or type(exc).__name__
            raise ArtifactError(
                f"cannot specialize the symbolic batch to {batch_size}: {detail[:600]}"
            ) from None
    return to_portable_artifact(bytes(refined), target_version)


def strip_locations(module: str) -> str:
    """MLIR text of ``module`` without debug locations (MLIR's ``strip-debuginfo`` pass); raises
    ArtifactError: the module does not parse."""
    from jax._src.interpreters import mlir as jax_mlir
    from jax.extend.mlir import passmanager

    _, ir, _ = _mlir()
    with jax_mlir.make_ir_context() as ctx:
        parsed = _parse(ir, ctx, module)
        passmanager.PassManager.parse("builtin.module(strip-debuginfo)").run(parsed.operation)
        return str(parsed)
