"""Implementation of :func:`export_torch`: a ``torch.nn.Module`` -> a bundle, through torchax.

``torchax.extract_jax`` gives the module's state as JAX arrays and a pure function, which
:func:`~hloserve.export.export_bundle` exports unchanged (docs/bundles.md, "The route, and why").
"""

from __future__ import annotations

import contextlib
import sysconfig
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict, Unpack

import hloserve
from hloserve.bundle.bundle import Bundle
from hloserve.bundle.manifest_sections import ClientTensorSpec, TensorSpec
from hloserve.errors import ExportError
from hloserve.export._export import OutputSpec, export_bundle

#: Frames under these are library code, not the user's.
_HLOSERVE = Path(hloserve.__file__).resolve().parent
_STDLIB = Path(sysconfig.get_paths()["stdlib"]).resolve()


class PassedOn(TypedDict, total=False):
    """The keyword arguments :func:`export_torch` passes on to ``export_bundle``."""

    overwrite: bool
    stablehlo_target: str | None
    client_inputs: Sequence[ClientTensorSpec] | None
    client_outputs: Sequence[ClientTensorSpec] | None
    files: Mapping[str, Path | str] | None
    progress: Callable[[str], None] | None


def export_torch(
    module: Any,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[OutputSpec],
    batch_sizes: Sequence[int],
    out_dir: Path | str,
    *,
    variants: Sequence[Mapping[str, int]] = (),
    **passed: Unpack[PassedOn],
) -> Bundle:
    """Export ``module(*inputs)`` (a ``torch.nn.Module`` in eval mode) as a bundle.

    Its parameters and buffers are the weights, by ``state_dict`` name (docs/bundles.md,
    "Exporting from PyTorch"). ``forward`` takes the inputs positionally and returns as
    :func:`~hloserve.export.export_bundle`'s ``fn`` does; the other arguments are its.

    Raises:
        ExportError: the module is in training mode, refuses the declared inputs, uses an
            operator torchax cannot lower, or branches on tensor values (each naming the
            submodule and source line); and every error of ``export_bundle``.
        ImportError: torch or torchax is missing (``pip install 'hloserve[export-torch]'``).
    """
    import torch

    from hloserve.export._torchax_compat import import_torchax

    if not isinstance(module, torch.nn.Module):
        raise ExportError(f"export_torch needs a torch.nn.Module, got {type(module).__name__}")
    training = [name or type(module).__name__ for name, m in module.named_modules() if m.training]
    if training:
        raise ExportError(
            f"{type(module).__name__} is in training mode (submodules {training[:5]}); call "
            "module.eval() before exporting, so that dropout is off and BatchNorm uses its "
            "running statistics"
        )
    sizes = sorted(set(batch_sizes)) or [0]
    _check_shapes(module, inputs, sizes[0], [dict(v) for v in variants] or [{}], torch)

    torchax = import_torchax()
    with warnings.catch_warnings():  # torchax reads every attribute, deprecated ones too
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        state, fn = torchax.extract_jax(module)
    calls = _CallStack(module)

    with calls.recording(), _explained(calls, torchax):
        return export_bundle(
            lambda params, *args: fn(params, args),
            state,
            inputs,
            outputs,
            batch_sizes,
            out_dir,
            variants=variants,
            **passed,
        )


def _check_shapes(
    module: Any,
    inputs: Sequence[TensorSpec],
    batch_size: int,
    variants: list[dict[str, int]],
    torch: Any,
) -> None:
    """Run the module in torch on zeros of each declared shape; refuse what it refuses."""
    for variant in variants:
        shapes = {spec.name: spec.shape_at(batch_size, variant) for spec in inputs}
        if any(d < 0 for shape in shapes.values() for d in shape):
            continue  # a variable axis without a variant: export_bundle names the problem
        args = [torch.zeros(shapes[spec.name], dtype=_torch_dtype(spec, torch)) for spec in inputs]
        try:
            with torch.no_grad():
                module(*args)
        except Exception as e:
            declared = ", ".join(
                f"{s.name} {s.dtype} {s.shape} {list(shapes[s.name])}" for s in inputs
            )
            raise ExportError(
                f"{type(module).__name__} does not accept the declared inputs ({declared}): "
                f"{type(e).__name__}: {_first_line(e)}{_user_frame(e)}; declare the shapes and "
                "dtypes its forward takes, in its argument order"
            ) from e


def _torch_dtype(spec: TensorSpec, torch: Any) -> Any:
    import numpy as np

    if spec.dtype == "bf16":
        return torch.bfloat16
    try:
        return torch.from_numpy(np.zeros((), spec.dtype_info.numpy)).dtype
    except TypeError:
        raise ExportError(f"input {spec.name!r}: dtype {spec.dtype} has no torch dtype") from None


class _CallStack:
    """The submodules being called, innermost last, while the module is traced."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self.stack: list[str] = []

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        handles = []
        for name, sub in self.module.named_modules():
            if not name:
                continue  # torchax calls the root's forward directly (no hooks)

            def enter(_m: Any, _args: Any, name: str = name) -> None:
                self.stack.append(name)

            def leave(_m: Any, _args: Any, _out: Any) -> None:
                self.stack.pop()

            handles.append(sub.register_forward_pre_hook(enter))
            handles.append(sub.register_forward_hook(leave))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def describe(self) -> str:
        """``submodule 'encoder.0.attn' (MultiheadAttention)`` for the innermost call, if any."""
        if not self.stack:
            return f"the top-level module ({type(self.module).__name__}.forward)"
        name = self.stack[-1]
        return f"submodule {name!r} ({type(self.module.get_submodule(name)).__name__})"


@contextlib.contextmanager
def _explained(calls: _CallStack, torchax: Any) -> Iterator[None]:
    """Turn torchax's and JAX's tracing errors into ExportErrors that say what to change."""
    import jax

    data_dependent = (
        jax.errors.ConcretizationTypeError,
        jax.errors.TracerArrayConversionError,
        jax.errors.TracerIntegerConversionError,
        jax.errors.NonConcreteBooleanIndexError,
    )
    try:
        yield
    except torchax.tensor.OperatorNotFound as e:
        op = str(e).removeprefix("Operator with name ").removesuffix(" has no lowering")
        raise ExportError(
            f"operator {op} (called in {calls.describe()}{_user_frame(e)}) has no StableHLO "
            "lowering in torchax; rewrite that code with supported torch operations, or give "
            "torchax a lowering for it (torchax.default_env().override_op_definition)"
        ) from e
    except AssertionError as e:  # torchax asserts on a custom (non-ATen) operator
        custom = _dispatched_op(e)
        if custom is None:
            raise
        raise ExportError(
            f"operator {custom} (called in {calls.describe()}{_user_frame(e)}) has no StableHLO "
            "lowering in torchax; give torchax a lowering for it "
            "(torchax.default_env().override_op_definition) or express it with torch operations"
        ) from e
    except NotImplementedError as e:  # a lowering that lacks this case (dtype, argument)
        raise ExportError(
            f"torchax cannot lower a call in {calls.describe()}{_user_frame(e)}: "
            f"{_first_line(e)}; rewrite that code with other torch operations"
        ) from e
    except data_dependent as e:
        raise ExportError(
            f"data-dependent control flow in {calls.describe()}{_user_frame(e)}: the code "
            "reads a tensor's value in Python (if/while on a tensor, .item(), int(), "
            "boolean-mask indexing), which an exported executable cannot do; compute both "
            "branches and select with torch.where, or use static shapes"
        ) from e


def _dispatched_op(error: BaseException) -> str | None:
    """The operator in torchax's ``Tensor.__torch_dispatch__`` frame of a traceback, if any."""
    tb = error.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "__torch_dispatch__" and "func" in frame.f_locals:
            return str(frame.f_locals["func"]).removesuffix(".default")
        tb = tb.tb_next
    return None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


def _user_frame(error: BaseException) -> str:
    """``, at model.py:12 (if x.sum() > 0:)`` for the last frame outside library code."""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        path = Path(frame.filename).resolve()
        if "site-packages" in path.parts or path.is_relative_to(_HLOSERVE):
            continue
        if path.is_relative_to(_STDLIB) or not path.is_file():
            continue
        code = f" ({frame.line.strip()})" if frame.line else ""
        return f", at {path.name}:{frame.lineno}{code}"
    return ""
