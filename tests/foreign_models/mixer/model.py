"""Test meta: ``y`` from the foreign ``plus_one``, ``logits`` from the digits bundle."""

from __future__ import annotations

from typing import Any

import numpy as np


def run(inputs: dict[str, np.ndarray], call: Any) -> dict[str, np.ndarray]:
    y = call("plus_one", {"x": inputs["x"]})["y"]
    logits = call("digits", {"image": inputs["image"]})["logits"]
    return {"y": y, "logits": logits}
