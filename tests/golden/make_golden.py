"""Regenerate the checked-in golden bundle ``tests/golden/affine/`` and its expected outputs.

    python tests/golden/make_golden.py

Only rerun on purpose (a format change): the point of the golden bundle is that bytes written by
an earlier hloserve keep loading and giving the same numbers.
"""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np

from hloserve.export import OutputSpec, TensorSpec, export_bundle

HERE = Path(__file__).resolve().parent


def affine(params: dict[str, np.ndarray], x: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    y = jnp.tanh(x @ params["w"] + params["b"])
    return y, jnp.argmax(y, axis=1).astype(jnp.int32)


def main() -> None:
    rng = np.random.default_rng(7)
    params = {
        "w": rng.standard_normal((4, 3)).astype(np.float32),
        "b": rng.standard_normal(3).astype(np.float32),
    }
    export_bundle(
        affine,
        params,
        [TensorSpec(name="x", dtype="f32", shape="nk", dims={"k": 4})],
        [OutputSpec("y", "nj"), OutputSpec("label", "n")],
        [1, 2],
        HERE / "affine",
        overwrite=True,
    )
    x = rng.standard_normal((2, 4)).astype(np.float32)
    y, label = affine(params, jnp.asarray(x))
    np.savez(HERE / "affine.expected.npz", x=x, y=np.asarray(y), label=np.asarray(label))


if __name__ == "__main__":
    main()
