"""Check a bundle end to end: manifest rules, weights, ``model.py``, every executable's ``main``.

``main`` takes ``(*weights_in_order, *inputs)`` and returns ``outputs`` at every compiled batch
size; a symbolic artifact is dynamic (``?``) at the batch axes only and specializes to each
compiled size. ``model.py`` is parsed and compiled, never imported (docs/bundles.md).
"""

from __future__ import annotations

import ast
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hloserve.bundle.bundle import Bundle, load_bundle
from hloserve.bundle.files import MODEL_PY
from hloserve.bundle.manifest import MANIFEST_FILE
from hloserve.bundle.manifest_sections import TensorSpec
from hloserve.bundle.safetensors_file import WeightInfo
from hloserve.bundle.stablehlo import (
    Signature,
    TensorType,
    is_portable_artifact,
    read_signature,
    specialize_batch,
    to_portable_artifact,
)
from hloserve.errors import (
    ArtifactError,
    BundleError,
    HloserveError,
    InvalidArgumentError,
    ManifestError,
)


@dataclass(frozen=True)
class Problem:
    """One finding: the file (relative to the bundle), what is wrong, whether only a warning."""

    file: str
    message: str
    warning: bool = False

    def __str__(self) -> str:
        return f"{self.file}: {'warning: ' if self.warning else ''}{self.message}"


def validate_bundle(
    path: Path | str, *, models: Mapping[str, str] | None = None, name: str | None = None
) -> list[Problem]:
    """Every problem found in the bundle at ``path``; no errors means the bundle is valid.

    ``models``: the bundles built with it, name -> kind (``"model"``/``"meta"``), to check a
    meta's ``meta.calls`` against (None skips that check); ``name``: the model's name when it is
    not the directory's (a repository's bundle copy).
    """
    path = Path(path)
    try:
        bundle = load_bundle(path, name=name)
    except ManifestError as exc:
        return [Problem(MANIFEST_FILE, p) for p in exc.problems]
    except HloserveError as exc:
        return [Problem(MANIFEST_FILE, exc.message.removeprefix(f"{path}: "))]
    if bundle.manifest.is_meta:
        return _check_meta(bundle, models) + _check_labels(bundle)
    problems = _check_weights(bundle) + _check_hooks(bundle) + _check_labels(bundle)
    if bundle.manifest.is_symbolic:
        for variant in sorted(bundle.manifest.symbolic_executables):
            problems += _check_symbolic(bundle, variant)
        return problems
    for variant, size in sorted(bundle.manifest.all_executables):
        problems += _check_executable(bundle, size, variant)
    return problems


def check_bundle(
    path: Path | str, *, models: Mapping[str, str] | None = None, name: str | None = None
) -> Bundle:
    """Load a bundle and validate it fully (``models``, ``name``: see :func:`validate_bundle`);
    raises BundleError: listing every error (status INVALID_ARGUMENT), naming the model."""
    path = Path(path)
    errors = [p for p in validate_bundle(path, models=models, name=name) if not p.warning]
    if errors:
        raise BundleError(path, errors, name)
    return load_bundle(path, name=name)


def _check_labels(bundle: Bundle) -> list[Problem]:
    problems = []
    for spec in bundle.manifest.wire_outputs:
        if spec.labels is None:
            continue
        try:  # one label per line: Triton's label_filename
            labels = (bundle.path / spec.labels).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(Problem(spec.labels, f"cannot read: {exc}"))
            continue
        classes = math.prod(spec.shape_at(1))
        if len(labels) != classes or not all(label.strip() for label in labels):
            problems.append(
                Problem(
                    spec.labels,
                    f"labels of output {spec.name!r}: expected {classes} non-empty lines, one "
                    f"per class (its shape {spec.shape!r}), got {len(labels)} lines"
                    + ("" if all(label.strip() for label in labels) else ", some empty"),
                )
            )
    return problems


def _check_meta(bundle: Bundle, models: Mapping[str, str] | None) -> list[Problem]:
    problems = []
    for call in bundle.manifest.calls:
        if call == bundle.name:
            problems.append(f"meta.calls: {call!r} is this meta itself")
        elif models is not None and call not in models:
            problems.append(
                f"meta.calls: model {call!r} is not among the bundles being built {sorted(models)}"
            )
        elif models is not None and models[call] == "meta":
            problems.append(
                f"meta.calls: model {call!r} is a meta model; a meta may only call models"
            )
    return [Problem(MANIFEST_FILE, p) for p in problems] + _check_run(bundle.path / MODEL_PY)


def _check_hooks(bundle: Bundle) -> list[Problem]:
    """``model.py`` defines ``preprocess``/``postprocess`` for declared client tensors."""
    manifest = bundle.manifest
    needed = [
        hook
        for hook, declared in (
            ("preprocess", manifest.client_inputs),
            ("postprocess", manifest.client_outputs),
        )
        if declared is not None
    ]
    missing = [
        Problem(MODEL_PY, f"missing: client tensors are declared, so model.py must define {h}")
        for h in needed
    ]
    tree = _parse(bundle.path / MODEL_PY, missing)
    if isinstance(tree, list):
        return tree
    defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    return [
        Problem(
            MODEL_PY,
            f"does not define a top-level function {h}, which the declared "
            f"{'client_inputs' if h == 'preprocess' else 'client_outputs'} need",
        )
        for h in needed
        if h not in defined
    ]


def _parse(file: Path, missing: list[Problem]) -> ast.Module | list[Problem]:
    """``model.py``'s syntax tree, or ``missing`` / the problems that stop its import.

    The source is also compiled (never run): the compiler refuses code the parser accepts
    (``return`` outside a function, a late ``from __future__``); its warnings are left alone.
    """
    try:
        source = file.read_text()
    except FileNotFoundError:
        return missing
    except (OSError, UnicodeDecodeError) as exc:
        return [Problem(MODEL_PY, f"cannot read: {exc}")]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(source, filename=str(file))
            compile(source, str(file), "exec", dont_inherit=True)
    except SyntaxError as exc:
        return [Problem(MODEL_PY, f"line {exc.lineno}: syntax error: {exc.msg}")]
    except ValueError as exc:  # null bytes in the source
        return [Problem(MODEL_PY, f"cannot compile: {exc}")]
    return tree


def _check_run(file: Path) -> list[Problem]:
    """A meta's ``model.py`` defines a top-level ``run(inputs, call)``."""
    missing = "missing: a meta bundle needs model.py defining run(inputs, call)"
    tree = _parse(file, [Problem(MODEL_PY, missing)])
    if isinstance(tree, list):
        return tree
    runs = [
        node
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "run"
    ]
    if not runs:
        return [Problem(MODEL_PY, "does not define a top-level function run(inputs, call)")]
    run = runs[-1]
    if isinstance(run, ast.AsyncFunctionDef):
        return [Problem(MODEL_PY, f"line {run.lineno}: run must be a plain function, not async")]
    args = run.args
    positional = len(args.posonlyargs) + len(args.args)
    if positional < 2 and args.vararg is None:
        return [
            Problem(
                MODEL_PY,
                f"line {run.lineno}: run takes {positional} positional argument(s), "
                "expected 2 (inputs, call)",
            )
        ]
    return []


def _check_weights(bundle: Bundle) -> list[Problem]:
    weights = bundle.manifest.weights
    if not weights.file:
        return []
    file = weights.file
    if not (bundle.path / file).is_file():
        return [Problem(file, "weights file is missing")]
    try:
        stored = bundle.stored_weights
    except InvalidArgumentError as exc:
        return [Problem(file, exc.message)]
    problems = [
        Problem(file, f"weight {name!r} is in weights.order but not in the file")
        for name in weights.order
        if name not in stored
    ]
    problems += [
        Problem(file, f"weight {name!r} is in the file but not in weights.order")
        for name in sorted(set(stored) - set(weights.order))
    ]
    return problems + _check_state_initial(bundle, stored)


def _check_state_initial(bundle: Bundle, stored: Mapping[str, WeightInfo]) -> list[Problem]:
    manifest, problems = bundle.manifest, []
    inputs = {s.name: s for s in manifest.inputs}
    for state in manifest.state:
        info = stored.get(state.initial_weight or "")
        spec = inputs.get(state.input)
        if info is None or spec is None:
            continue
        row = tuple(d for i, d in enumerate(spec.shape_at(1)) if i != spec.batch_axis)
        if (tuple(info.shape), info.dtype) != (row, spec.dtype):
            problems.append(
                f"initial state of {spec.name!r}: weight {state.initial_weight!r} is "
                f"{info.dtype} {_dims(tuple(info.shape))}, the state row is "
                f"{spec.dtype} {_dims(row)}"
            )
    return [Problem(str(manifest.weights.file), p) for p in problems]


def _check_symbolic(bundle: Bundle, variant: int) -> list[Problem]:
    manifest = bundle.manifest
    file = manifest.symbolic_executables[variant]
    problems = _check_executable(bundle, None, variant)
    if any(not p.warning for p in problems) or not manifest.batching.compiled_batch_sizes:
        return problems
    data = to_portable_artifact((bundle.path / file).read_bytes())
    spec = next(s for s in manifest.inputs if s.batch_axis is not None)
    letter = spec.shape[spec.batch_axis or 0]
    for size in manifest.batching.compiled_batch_sizes:
        try:
            specialize_batch(data, size)
        except ArtifactError as exc:
            why = f"(input {spec.name!r}, batch axis {letter!r}): {exc.message}"
            problems.append(
                Problem(
                    file,
                    f"compiled batch size {size} is refused by the artifact's constraints {why}",
                )
            )
    return problems


def _check_executable(bundle: Bundle, size: int | None, variant: int = 0) -> list[Problem]:
    """Check one artifact's ``main`` against the manifest; ``size`` None: a symbolic batch."""
    manifest = bundle.manifest
    if size is None:
        file, what = manifest.symbolic_executables[variant], "the symbolic batch"
    else:
        file = manifest.all_executables[(variant, size)]
        what = f"batch size {size}" if size else "the unbatched executable"
    if not (bundle.path / file).is_file():
        return [Problem(file, f"artifact for {what} is missing")]
    data = (bundle.path / file).read_bytes()
    warnings = []
    if not is_portable_artifact(data) and _is_text(data):
        text = "MLIR text, not a portable artifact: run `hloserve bundle convert` (text has no "
        warnings.append(
            Problem(file, text + "compatibility guarantee across StableHLO versions)", warning=True)
        )
    try:
        errors = _signature_errors(bundle, read_signature(data), size, variant)
    except ArtifactError as exc:
        errors = [exc.message]
    return warnings + [Problem(file, e) for e in errors]


def _signature_errors(
    bundle: Bundle, signature: Signature, size: int | None, variant: int
) -> list[str]:
    manifest, sizes = bundle.manifest, bundle.manifest.variant_dims[variant]
    order = manifest.weights.order
    expected_args = len(order) + len(manifest.inputs)
    if len(signature.inputs) != expected_args:
        return [
            f"main takes {len(signature.inputs)} arguments, expected {expected_args} "
            f"({len(order)} weights + {len(manifest.inputs)} inputs)"
        ]
    try:
        stored = bundle.stored_weights
    except InvalidArgumentError:
        stored = {}  # unreadable weights file: reported once by _check_weights
    errors = []
    for name, actual in zip(order, signature.inputs[: len(order)], strict=True):
        if (info := stored.get(name)) is not None:
            errors += _compare(f"weight {name!r}", info.shape, info.dtype, actual, "safetensors")
    for spec, actual in zip(manifest.inputs, signature.inputs[len(order) :], strict=True):
        errors += _compare_spec("input", spec, size, actual, sizes)
    if len(signature.outputs) != len(manifest.outputs):
        n, declared = len(signature.outputs), len(manifest.outputs)
        return [*errors, f"main returns {n} results, manifest declares {declared} outputs"]
    for spec, actual in zip(manifest.outputs, signature.outputs, strict=True):
        errors += _compare_spec("output", spec, size, actual, sizes)
    return errors


def _is_text(data: bytes) -> bool:
    try:
        return bool(data.strip()) and "\x00" not in data.decode("utf-8")
    except UnicodeDecodeError:
        return False


def _compare_spec(
    role: str, spec: TensorSpec, size: int | None, actual: TensorType, sizes: dict[str, int]
) -> list[str]:
    shape: tuple[int | None, ...] = spec.shape_at(size or 0, sizes)
    if size is None:  # a symbolic batch: dynamic at the batch axis
        shape = tuple(None if i == spec.batch_axis else d for i, d in enumerate(shape))
    return _compare(f"{role} {spec.name!r}", shape, spec.dtype, actual, "manifest")


def _compare(
    subject: str, shape: tuple[int | None, ...], dtype: str, actual: TensorType, source: str
) -> list[str]:
    errors = []
    if actual.dtype_token != dtype:
        errors.append(
            f"{subject}: dtype {dtype} in {source}, {actual.element_type} in the artifact"
        )
    if actual.shape != shape:
        errors.append(
            f"{subject}: shape {_dims(shape)} in {source}, {_dims(actual.shape)} in the artifact"
        )
    return errors


def _dims(shape: tuple[int | None, ...]) -> str:
    """``[?, 8, 8, 1]``: ``?`` for a dynamic size."""
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
