"""A small CNN for scikit-learn's 8x8 digits, in plain JAX (no optimizer library needed).

Data: ``sklearn.datasets.load_digits`` (1,797 images, ships with scikit-learn). Pixels are
scaled by 1/16 into [0, 1] and laid out NHWC as (n, 8, 8, 1) float32. Training split: images
[0, 1437); test split: [1437, 1797).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

TRAIN_END = 1437
SEED = 1

Params = dict[str, dict[str, Any]]


def load_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train_images, train_labels, test_images, test_labels); images f32 (n, 8, 8, 1)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., None]
    labels = digits.target.astype(np.int32)
    return images[:TRAIN_END], labels[:TRAIN_END], images[TRAIN_END:], labels[TRAIN_END:]


def init_params(key: jax.Array) -> Params:
    """He-initialized weights: conv 3x3 1->16, conv 3x3 16->32 (stride 2), dense 512->10."""
    k1, k2, k3 = jax.random.split(key, 3)

    def he(k: jax.Array, shape: tuple[int, ...], fan_in: int) -> jax.Array:
        return jax.random.normal(k, shape, jnp.float32) * jnp.sqrt(2.0 / fan_in)

    return {
        "conv1": {"kernel": he(k1, (3, 3, 1, 16), 9), "bias": jnp.zeros(16)},
        "conv2": {"kernel": he(k2, (3, 3, 16, 32), 144), "bias": jnp.zeros(32)},
        "dense": {"kernel": he(k3, (4 * 4 * 32, 10), 512), "bias": jnp.zeros(10)},
    }


def apply(params: Params, image: jax.Array) -> jax.Array:
    """Logits f32 (n, 10) for images f32 (n, 8, 8, 1)."""
    dn = ("NHWC", "HWIO", "NHWC")
    x = jax.lax.conv_general_dilated(
        image, params["conv1"]["kernel"], (1, 1), "SAME", dimension_numbers=dn
    )
    x = jax.nn.relu(x + params["conv1"]["bias"])
    x = jax.lax.conv_general_dilated(
        x, params["conv2"]["kernel"], (2, 2), "SAME", dimension_numbers=dn
    )
    x = jax.nn.relu(x + params["conv2"]["bias"])
    x = x.reshape(x.shape[0], -1)
    return x @ params["dense"]["kernel"] + params["dense"]["bias"]


def _shift(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Each image moved by a random offset in {-1, 0, 1} on both axes, zero filled."""
    padded = np.pad(images, ((0, 0), (1, 1), (1, 1), (0, 0)))
    dy, dx = rng.integers(0, 3, (2, len(images)))
    return np.stack(
        [padded[i, y : y + 8, x : x + 8] for i, (y, x) in enumerate(zip(dy, dx, strict=True))]
    )


def train(seed: int = SEED, steps: int = 1500, batch: int = 128, lr: float = 2e-3) -> Params:
    """Adam (Kingma & Ba 2015, default betas) on cross-entropy with random 1-pixel shifts.

    Deterministic for a seed. The shifts matter: the test split comes from other writers.
    """
    images, labels, _, _ = load_split()
    params = init_params(jax.random.PRNGKey(seed))

    def loss(p: Params, x: jax.Array, y: jax.Array) -> jax.Array:
        logp = jax.nn.log_softmax(apply(p, x))
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    b1, b2, eps = 0.9, 0.999, 1e-8

    @jax.jit
    def step(
        state: tuple[Any, Any, Any, jax.Array], x: jax.Array, y: jax.Array
    ) -> tuple[Any, Any, Any, jax.Array]:
        p, m, v, t = state
        g = jax.grad(loss)(p, x, y)
        t = t + 1
        m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, m, g)
        v = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)
        scale = lr * jnp.sqrt(1 - b2**t) / (1 - b1**t)
        p = jax.tree_util.tree_map(lambda p, m, v: p - scale * m / (jnp.sqrt(v) + eps), p, m, v)
        return p, m, v, t

    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    state = (params, zeros, zeros, jnp.zeros((), jnp.float32))
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        idx = rng.integers(0, len(images), batch)
        state = step(state, jnp.asarray(_shift(images[idx], rng)), jnp.asarray(labels[idx]))
    return jax.tree_util.tree_map(np.asarray, state[0])


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of rows whose argmax equals the label."""
    return float(np.mean(np.argmax(logits, axis=1) == labels))
