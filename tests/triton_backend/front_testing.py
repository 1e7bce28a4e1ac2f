"""A front over an in-process runtime: the path the BLS shim takes, minus Triton.

Imported by test_front.py and test_variants_hooks.py: ``call_runtime`` is ``runtime.execute``
(:class:`Recorder` notes each call's input shapes), the hooks the bundle's own ``model.py`` (the
identity without one), as ``FrontModel.from_args`` loads them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from hloserve.bundle import load_bundle
from hloserve.triton_backend.front import FrontModel, load_hooks
from hloserve.triton_backend.runtime import RuntimeModel


class Recorder:
    """call_runtime over an in-process runtime, recording each call's input shapes."""

    def __init__(self, runtime: RuntimeModel) -> None:
        self.runtime = runtime
        self.calls: list[dict[str, tuple[int, ...]]] = []

    def __call__(
        self, inputs: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        self.calls.append({k: v.shape for k, v in inputs.items()})
        return {k: np.asarray(v) for k, v in self.runtime.execute(inputs, outputs).items()}


def front_over(
    name: str, paths: Mapping[str, Path], runtime: RuntimeModel
) -> tuple[FrontModel, Recorder]:
    """The front of bundle ``paths[name]`` over ``runtime``, and the recorder of its calls."""
    recorder = Recorder(runtime)
    bundle = load_bundle(paths[name])
    return FrontModel(name, bundle, recorder, hooks=load_hooks(name, bundle)), recorder
