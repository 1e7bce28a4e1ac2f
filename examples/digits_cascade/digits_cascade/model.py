"""Cascade: ``digits_fast`` labels every image; images whose top-1 probability is under
:data:`THRESHOLD` go to the stronger ``digits`` CNN (only those: one sub-call for the lot).

Inputs: ``image`` f32 (n, 8, 8, 1), n >= 1 of any size (0 images: INVALID_ARGUMENT before
``run``). Outputs: ``label`` i32 (n,), ``stage`` bytes (n,) -- ``b"fast"`` or ``b"strong"``, the
model whose answer ``label`` is. ``call`` splits a sub-call larger than the callee's largest
compiled batch (32) into chunks of at most that size (docs/meta_models.md), so a request of
any size works; escalation is skipped when no image is unsure (a sub-call needs >= 1 item).
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Top-1 probability of the fast model under which an image is escalated.
THRESHOLD = 0.8
FAST = "digits_fast"
STRONG = "digits"


def top1(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(argmax i32 (n,), top-1 softmax probability f32 (n,)) of logits f32 (n, 10)."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
    return probs.argmax(axis=1).astype(np.int32), probs.max(axis=1)


def run(inputs: dict[str, np.ndarray], call: Any) -> dict[str, np.ndarray]:
    image = inputs["image"]
    label, confidence = top1(call(FAST, {"image": image}, ["logits"])["logits"])
    unsure = confidence < THRESHOLD
    stage = np.array([b"fast"] * len(image), dtype=object)
    if unsure.any():
        strong = call(STRONG, {"image": np.ascontiguousarray(image[unsure])}, ["logits"])
        label[unsure] = strong["logits"].argmax(axis=1)
        stage[unsure] = b"strong"
    return {"label": label, "stage": stage}
