"""SequenceStates: START resets, END drops, the idle timer drops, bytes per model (pure logic)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from hloserve.bundle.manifest import parse_manifest
from hloserve.errors import InvalidArgumentError
from hloserve.triton_backend.runtime.sequence_state import SequenceStates
from tests.bundle.test_state import VALID


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _views() -> tuple[list[np.ndarray], list[np.ndarray]]:
    return [np.full((1, 4), -1, np.float32), np.zeros((1, 4), np.float32)], [
        np.zeros((1, 4), np.float32),
        np.zeros((1, 4), np.float32),
    ]


def test_start_end_idle_and_bytes() -> None:
    manifest = parse_manifest(copy.deepcopy(VALID))
    clock = Clock()
    states = SequenceStates(idle_s=1.0, clock=clock)
    ins, outs = _views()
    states.load("acc", manifest, [7, True, False], lambda n: np.ones(4), ins)
    assert ins[0].tolist() == [[0, 0, 0, 0]]  # zeros at START, over what the front sent
    outs[1][...] = 5
    states.store("acc", manifest, [7, False, False], outs)
    ins, _ = _views()
    states.load("acc#2", manifest, [7, True, False], lambda n: np.ones(4), ins)  # other key
    assert states.nbytes() == {"acc": 32}
    ins, _ = _views()
    states.load("acc", manifest, [7, False, False], lambda n: np.ones(4), ins)
    assert ins[0].tolist() == [[5, 5, 5, 5]]
    states.store("acc", manifest, [7, False, True], outs)  # END
    with pytest.raises(InvalidArgumentError, match="sequence 7 has no state here"):
        states.load("acc", manifest, [7, False, False], lambda n: np.ones(4), _views()[0])
    clock.now = 0.9
    assert states.expire() == 0
    clock.now = 1.1
    assert states.expire() == 1 and states.nbytes() == {}


def test_initial_weight() -> None:
    data = copy.deepcopy(VALID)
    data["weights"] = {"file": "w.safetensors", "order": ["s0"]}
    data["state"][0]["initial"] = "weight:s0"
    manifest = parse_manifest(data)
    ins, _ = _views()
    SequenceStates().load("acc", manifest, [1, True, False], lambda n: np.arange(4.0), ins)
    assert ins[0].tolist() == [[0, 1, 2, 3]]
