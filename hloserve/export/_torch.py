"""Implementation of :func:`export_torch`: a ``torch.nn.Module`` -> a bundle, through torchax.

torchax (https://github.com/google/torchax) runs a module's ATen operators as JAX functions;
``torchax.extract_jax`` splits the module into a state dict of JAX arrays (parameters and
buffers) and a pure function ``f(state, args)``. That function and that state are handed to
:func:`~hloserve.export.export_bundle` unchanged, so the bundle is what a JAX model would give:
one StableHLO portable artifact per batch size (and variant), the state as the leading arguments
of ``main``, stored in ``weights.safetensors``. docs/bundles.md (PyTorch) says why this route.
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

#: Frames under these are library code, not the user's (see :func:`_user_frame`).
_HLOSERVE = Path(hloserve.__file__).resolve().parent
_STDLIB = Path(sysconfig.get_paths()["stdlib"]).resolve()


class PassedOn(TypedDict, total=False):
    """The keyword arguments :func:`export_torch` passes on to
    :func:`~hloserve.export.export_bundle` unchanged (documented there)."""

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

    The module's parameters and buffers (BatchNorm running statistics included) become the
    weights, named by their ``state_dict`` keys (``layer1.0.bn1.running_mean``) and passed to
    every executable as arguments, never baked in as constants. A parameter shared by two
    submodules (tied weights) is stored once, under its first name; a tensor kept as a plain
    attribute is a weight too (torchax collects every tensor attribute). 64-bit integer buffers
    are stored as i32 and 64-bit floats as f32 (JAX's default precision, as torchax converts
    them).

    Args:
        module: the ``torch.nn.Module``, in eval mode (``module.eval()``). ``forward`` takes the
            inputs positionally, in ``inputs`` order, and returns one tensor, a tuple/list in
            ``outputs`` order, or a dict keyed by output name.
        inputs, outputs, batch_sizes, out_dir, variants: as for
            :func:`~hloserve.export.export_bundle`.
        passed: ``overwrite``, ``stablehlo_target``, ``client_inputs``, ``client_outputs``,
            ``files``, ``progress``: passed on to :func:`~hloserve.export.export_bundle`.

    Returns:
        The written bundle, already validated.

    Raises:
        ExportError: the module is in training mode (call ``.eval()``), does not accept the
            declared input shapes or dtypes, uses an operator torchax cannot lower (named, with
            the submodule and source line that called it), or branches on tensor values
            (data-dependent control flow); and every error of
            :func:`~hloserve.export.export_bundle`.
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
    with warnings.catch_warnings():
        # torchax collects tensors by reading every attribute of every submodule, which
        # trips deprecation warnings of properties (transformers' is_gradient_checkpointing)
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        state, fn = torchax.extract_jax(module)
    calls = _CallStack(module)

    def forward(params: Any, *args: Any) -> Any:
        return fn(params, args)

    with calls.recording(), _explained(calls, torchax):
        return export_bundle(
            forward,
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
    """Run the module once in torch on zeros of each declared shape; refuse what it refuses."""
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
    except AssertionError as e:
        # an operator outside ATen (torch.library.custom_op) reaches torchax's tensor type
        # without passing its lowering table, and torchax asserts; name that operator
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
