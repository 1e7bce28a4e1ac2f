"""A bundle's ``preprocess``/``postprocess`` from its ``model.py`` (docs/bundles.md, "Hooks")."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import numpy as np

from hloserve.bundle.files import MODEL_PY, import_model_py
from hloserve.bundle.front_spec import FrontBundle
from hloserve.errors import InvalidArgumentError, ModelPyImportError

if TYPE_CHECKING:
    from hloserve.bundle.bundle import Bundle

Tensors = dict[str, np.ndarray]


class Hooks(Protocol):
    """Per-request pre/post processing (docs/bundles.md, "Hooks"): each call sees one request,
    never padding; ``postprocess`` also gets what ``preprocess`` returned."""

    def preprocess(self, inputs: Tensors) -> Tensors: ...

    def postprocess(self, outputs: Tensors, inputs: Tensors) -> Tensors: ...


class IdentityHooks:
    """The default hooks: tensors pass through unchanged."""

    def preprocess(self, inputs: Tensors) -> Tensors:
        return inputs

    def postprocess(self, outputs: Tensors, inputs: Tensors) -> Tensors:
        return outputs


class ModuleHooks:
    """Hooks from a module; ``postprocess`` may take ``(outputs)`` or ``(outputs, inputs)``; a
    function the module lacks is the identity."""

    def __init__(self, module: object) -> None:
        self.module = module
        self._pre = getattr(module, "preprocess", None)
        self._post = getattr(module, "postprocess", None)
        self._post_takes_inputs = self._post is not None and _positional_count(self._post) >= 2

    def preprocess(self, inputs: Tensors) -> Tensors:
        return dict(self._pre(inputs)) if self._pre is not None else inputs

    def postprocess(self, outputs: Tensors, inputs: Tensors) -> Tensors:
        if self._post is None:
            return outputs
        if self._post_takes_inputs:
            return dict(self._post(outputs, inputs))
        return dict(self._post(outputs))


def _positional_count(fn: Callable[..., object]) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return 2
    return sum(1 for p in params if p.kind in kinds)


def load_hooks(name: str, bundle: Bundle | FrontBundle) -> Hooks:
    """The hooks of a bundle: its ``model.py`` (imported with ``__file__`` set), else identity.
    InvalidArgumentError: ``model.py`` fails to import, or ``client_inputs`` / ``client_outputs``
    lack ``preprocess`` / ``postprocess``."""
    bundle = FrontBundle.of(bundle)
    path = bundle.path / MODEL_PY
    module = None
    if path.is_file():
        module_name = f"hloserve_hooks_{name.replace('.', '_').replace('-', '_')}"
        try:
            module = import_model_py(path, module_name)
        except ModelPyImportError as exc:
            raise InvalidArgumentError(f"model {name!r}: {path} failed to import: {exc}") from None
    if bundle.spec.client_inputs is not None and getattr(module, "preprocess", None) is None:
        raise InvalidArgumentError(
            f"model {name!r}: client_inputs are declared but {MODEL_PY} defines no preprocess "
            "to turn them into the executable's inputs"
        )
    if bundle.spec.client_outputs is not None and getattr(module, "postprocess", None) is None:
        raise InvalidArgumentError(
            f"model {name!r}: client_outputs are declared but {MODEL_PY} defines no "
            "postprocess to make them from the executable's outputs"
        )
    return ModuleHooks(module) if module is not None else IdentityHooks()
