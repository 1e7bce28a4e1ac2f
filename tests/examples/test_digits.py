"""The digits example: the bundle validates and its artifacts reproduce the JAX model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from hloserve.bundle.validate import check_bundle
from hloserve.triton_backend.runtime.compile import compile_artifact

pytestmark = pytest.mark.slow


def test_digits_bundle_validates(digits_bundle: Path) -> None:
    bundle = check_bundle(digits_bundle)
    m = bundle.manifest
    assert bundle.name == "digits" and m.batching.compiled_batch_sizes == [1, 8, 32]
    assert [(t.name, t.dtype, t.shape, t.dims) for t in m.inputs] == [
        ("image", "f32", "nhwc", {"h": 8, "w": 8, "c": 1})
    ]
    assert [(t.name, t.dtype, t.shape, t.dims) for t in m.outputs] == [
        ("logits", "f32", "nk", {"k": 10})
    ]


def test_artifacts_reproduce_jax_logits_at_every_batch_size(
    digits_bundle: Path, digits_model: Any, digits_params: Any
) -> None:
    _, _, test_x, test_y = digits_model.load_split()
    reference = np.asarray(jax.jit(digits_model.apply)(digits_params, test_x))
    bundle = check_bundle(digits_bundle)
    weights = bundle.load_weights()
    for size in bundle.manifest.batching.compiled_batch_sizes:
        exe = compile_artifact(bundle.read_artifact(size))
        usable = len(test_x) // size * size  # 360 = 45 x 8 = 11 x 32 + 8: the tail is checked below
        logits = np.concatenate(
            [exe.run_numpy([*weights, test_x[i : i + size]])[0] for i in range(0, usable, size)]
        )
        np.testing.assert_allclose(logits, reference[:usable], rtol=1e-5, atol=1e-5)
        assert (logits.argmax(1) == reference[:usable].argmax(1)).all()
        if usable < len(test_x):  # pad the remainder up to the compiled size, as the server will
            tail = test_x[usable:]
            padded = np.concatenate(
                [tail, np.zeros((size - len(tail), *tail.shape[1:]), tail.dtype)]
            )
            out = exe.run_numpy([*weights, padded])[0][: len(tail)]
            np.testing.assert_allclose(out, reference[usable:], rtol=1e-5, atol=1e-5)
    full = compile_artifact(bundle.read_artifact(8))
    logits = np.concatenate(
        [full.run_numpy([*weights, test_x[i : i + 8]])[0] for i in range(0, 360, 8)]
    )
    assert digits_model.accuracy(logits, test_y) >= 0.95
