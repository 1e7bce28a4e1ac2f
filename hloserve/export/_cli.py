"""``hloserve export torch``: the command line's tensor notation and factory loading.

Input ``NAME:DTYPE:SHAPE[:DIMS]`` (``x:f32:nchw:c=3,h=224,w=224``; ``s=-1`` a variable axis),
output ``NAME:SHAPE`` (``logits:nk``), each checked by the manifest's :class:`TensorSpec`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hloserve.bundle.bundle import Bundle
from hloserve.bundle.manifest_sections import TensorSpec
from hloserve.errors import ExportError
from hloserve.export._export import OutputSpec


def _sizes(text: str, what: str) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for item in filter(None, text.split(",")):
        letter, eq, size = item.partition("=")
        try:
            if not eq:
                raise ValueError
            sizes[letter.strip()] = int(size)
        except ValueError:
            raise ExportError(
                f"{what}: {item!r} must be LETTER=SIZE (e.g. h=224; -1 for a variable axis)"
            ) from None
    return sizes


def parse_input(text: str) -> TensorSpec:
    """``NAME:DTYPE:SHAPE[:DIMS]`` -> a :class:`TensorSpec` (raises :class:`ExportError`)."""
    parts = text.split(":")
    if len(parts) not in (3, 4):
        raise ExportError(
            f"--input {text!r} must be NAME:DTYPE:SHAPE[:DIMS], e.g. x:f32:nchw:c=3,h=224,w=224"
        )
    name, dtype, shape = parts[:3]
    dims = _sizes(parts[3], f"--input {text!r}") if len(parts) == 4 else {}
    return _spec(f"--input {text!r}", name=name, dtype=dtype, shape=shape, dims=dims)


def _spec(flag: str, **fields: Any) -> TensorSpec:
    """A :class:`TensorSpec`, its rule violations raised as :class:`ExportError`."""
    try:
        return TensorSpec(**fields)
    except ValidationError as e:
        problems = "; ".join(str(err["msg"]).removeprefix("Value error, ") for err in e.errors())
        raise ExportError(f"{flag}: {problems}") from None


def parse_output(text: str) -> OutputSpec:
    """``NAME:SHAPE`` -> an :class:`OutputSpec` (raises :class:`ExportError`)."""
    name, colon, shape = text.partition(":")
    if not colon or ":" in shape:
        raise ExportError(f"--output {text!r} must be NAME:SHAPE, e.g. logits:nk")
    dims = {c: 1 for c in shape if c not in "nb"}  # the manifest's name and letter rules only
    _spec(f"--output {text!r}", name=name, dtype="f32", shape=shape, dims=dims)
    return OutputSpec(name=name, shape=shape)


def parse_batch_sizes(text: str) -> list[int]:
    """``"1,8"`` -> ``[1, 8]``; empty for an unbatched model."""
    try:
        sizes = [int(s) for s in filter(None, text.split(","))]
    except ValueError:
        raise ExportError(f"--batch-sizes {text!r} must be sizes like 1,8,32") from None
    if any(s <= 0 for s in sizes):
        raise ExportError(f"--batch-sizes {text!r}: every size must be positive")
    return sizes


def load_factory(target: str) -> Callable[[], Any]:
    """``PACKAGE.MODULE:FACTORY`` -> the factory (the current directory is importable); raises
    ExportError: malformed target, module not importable, or no such callable."""
    module_name, colon, attr = target.partition(":")
    if not colon or not module_name or not attr:
        raise ExportError(f"{target!r} must be PACKAGE.MODULE:FACTORY, e.g. mypkg.models:build")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ExportError(f"cannot import {module_name!r} (from {target!r}): {e}") from e
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ExportError(f"{module_name} has no callable {attr!r} (from {target!r})")
    return factory


def export_torch_command(
    target: str,
    inputs: Sequence[str],
    outputs: Sequence[str],
    batch_sizes: str,
    out_dir: Path,
    *,
    variants: Sequence[str] = (),
    overwrite: bool = False,
    say: Callable[[str], None] = print,
) -> Bundle:
    """``hloserve export torch``: parse, build the module, export, report progress."""
    from hloserve.export._torch import export_torch

    for package in ("torch", "torchax"):
        if importlib.util.find_spec(package) is None:
            raise ExportError(
                f"hloserve export torch needs {package}: pip install 'hloserve[export-torch]'"
            )
    in_specs = [parse_input(t) for t in inputs]
    out_specs = [parse_output(t) for t in outputs]
    sizes = parse_batch_sizes(batch_sizes)
    shapes = [_sizes(t, f"--variant {t!r}") for t in variants]  # e.g. s=32
    factory = load_factory(target)
    module = factory()
    started = time.perf_counter()
    say(f"{out_dir.name}: exporting {type(module).__name__} from {target}")
    bundle = export_torch(
        module,
        in_specs,
        out_specs,
        sizes,
        out_dir,
        overwrite=overwrite,
        variants=shapes,
        progress=lambda line: say(f"{out_dir.name}: {line}"),
    )
    weights = bundle.manifest.weights.order
    say(
        f"{out_dir}: wrote {len(bundle.manifest.all_executables)} executable(s), "
        f"{len(weights)} weights, in {time.perf_counter() - started:.1f} s"
    )
    return bundle
