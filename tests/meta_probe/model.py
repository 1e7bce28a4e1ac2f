"""Test meta: sleep ``ctl[1]`` ms, then call the model ``ctl[0]`` selects with ``x``."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

TARGETS = {0: "affine", 1: "digits", 2: "broken", 3: "ghost"}


def run(inputs: dict[str, np.ndarray], call: Any) -> dict[str, np.ndarray]:
    started = time.time()
    action, sleep_ms = (int(v) for v in inputs["ctl"])
    time.sleep(sleep_ms / 1000)
    y = call(TARGETS[action], {"x": inputs["x"]}, ["y"])["y"]
    return {"y": y, "t": np.array([started, time.time()])}
