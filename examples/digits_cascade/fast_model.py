"""The cascade's fast stage: multinomial logistic regression on the 64 pixels, in plain JAX.

Same data and split as ``examples/digits/digits_model.py`` (scikit-learn's digits, training
images [0, 1437)). One dense layer: it answers in one small matmul and is less accurate than
the CNN, which is what a cascade's first stage is for.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Params = dict[str, dict[str, Any]]


def apply(params: Params, image: jax.Array) -> jax.Array:
    """Logits f32 (n, 10) for images f32 (n, 8, 8, 1)."""
    x = image.reshape(image.shape[0], -1)
    return x @ params["dense"]["kernel"] + params["dense"]["bias"]


def train(
    images: np.ndarray, labels: np.ndarray, steps: int = 1000, lr: float = 0.5, l2: float = 1e-4
) -> Params:
    """Full-batch gradient descent on cross-entropy + L2; deterministic (zero init).

    Args:
        images: f32 (n, 8, 8, 1) in [0, 1].
        labels: i32 (n,) in 0..9.
        steps: gradient steps.
        lr: learning rate.
        l2: weight decay on the kernel.
    """
    params: Params = {"dense": {"kernel": jnp.zeros((64, 10)), "bias": jnp.zeros(10)}}
    x, y = jnp.asarray(images), jnp.asarray(labels)

    def loss(p: Params) -> jax.Array:
        logp = jax.nn.log_softmax(apply(p, x))
        nll = -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))
        return nll + l2 * jnp.sum(p["dense"]["kernel"] ** 2)

    @jax.jit
    def step(p: Params) -> Params:
        g = jax.grad(loss)(p)
        return jax.tree_util.tree_map(lambda w, d: w - lr * d, p, g)

    for _ in range(steps):
        params = step(params)
    return jax.tree_util.tree_map(np.asarray, params)
