"""SequenceStates: START resets, END drops, the idle timer drops, bytes per model, rows kept on
the device, gathered and scattered per row there, and a new sequence that does not fit the
device budget refused (pure logic over JAX's CPU device; memory statistics faked at the device).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jax
import numpy as np
import pytest

from hloserve.bundle.manifest import parse_manifest
from hloserve.errors import InvalidArgumentError, Status, UnavailableError
from hloserve.triton_backend.runtime.device_memory import FAKE_STATS_ENV, MARGIN, DeviceMemory
from hloserve.triton_backend.runtime.sequence_state import SequenceStates, gather, scatter
from hloserve.triton_backend.runtime.weight_cache import WeightCache
from tests.bundle.test_state import VALID


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _ones(name: str) -> np.ndarray:
    return np.ones(4, np.float32)


def test_start_end_idle_and_bytes() -> None:
    manifest = parse_manifest(copy.deepcopy(VALID))
    clock = Clock()
    states = SequenceStates(clock=clock)  # the manifest's default: 1 s idle
    rows = states.rows("acc", manifest, [7, True, False], _ones)
    assert isinstance(rows[0], jax.Array)  # on the device, not a host copy
    assert np.asarray(rows[0]).tolist() == [[0, 0, 0, 0]]  # zeros at START
    states.store("acc", [7, False, False], [jax.numpy.full((1, 4), 5.0)])
    states.rows("acc#2", manifest, [7, True, False], _ones)  # another generation
    assert states.nbytes() == {"acc": 32}
    assert np.asarray(states.rows("acc", manifest, [7, False, False], _ones)[0]).tolist() == [
        [5, 5, 5, 5]
    ]
    assert np.asarray(states.rows("acc", manifest, [7, True, False], _ones)[0]).tolist() == [
        [0, 0, 0, 0]
    ]  # START again resets
    states.store("acc", [7, False, True], [jax.numpy.zeros((1, 4))])  # END
    with pytest.raises(InvalidArgumentError, match="sequence 7 has no state here"):
        states.rows("acc", manifest, [7, False, False], _ones)
    clock.now = 0.9
    assert states.expire() == 0
    clock.now = 1.1
    assert states.expire() == 1 and states.nbytes() == {}


def test_the_idle_timeout_is_the_models() -> None:
    data = copy.deepcopy(VALID)
    data["sequence"] = {"max_sequence_idle_microseconds": 5_000_000}
    manifest = parse_manifest(data)
    clock = Clock()
    states = SequenceStates(clock=clock)
    states.rows("acc", manifest, [1, True, False], _ones)
    clock.now = 4.9
    assert states.expire() == 0
    with pytest.raises(InvalidArgumentError, match="idle longer than 5 s"):
        states.rows("acc", manifest, [2, False, False], _ones)
    clock.now = 5.1
    assert states.expire() == 1


def test_initial_weight() -> None:
    data = copy.deepcopy(VALID)
    data["weights"] = {"file": "w.safetensors", "order": ["s0"]}
    data["state"][0]["initial"] = "weight:s0"
    manifest = parse_manifest(data)
    rows = SequenceStates().rows("acc", manifest, [1, True, False], lambda n: np.arange(4.0))
    assert np.asarray(rows[0]).tolist() == [[0, 1, 2, 3]]


def test_gather_pads_and_scatter_splits_per_row() -> None:
    rows = [jax.numpy.full((1, 2), float(i)) for i in (1, 2, 3)]
    batch = gather(rows, 8)
    assert isinstance(batch, jax.Array) and batch.shape == (8, 2)
    assert np.asarray(batch)[:, 0].tolist() == [1, 2, 3, 0, 0, 0, 0, 0]
    back = scatter(batch, 3)
    assert [np.asarray(r).tolist() for r in back] == [[[1, 1]], [[2, 2]], [[3, 3]]]
    assert gather(rows[:1], 1) is rows[0] and scatter(rows[0], 1) == [rows[0]]


def test_a_sequence_that_does_not_fit_the_device_budget_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Budget sized from the card: limit - margin leaves room for exactly 3 sequences of 16 B
    beside no weights; the 4th is refused with UNAVAILABLE naming the budget, END frees one."""
    manifest = parse_manifest(copy.deepcopy(VALID))
    limit = 10_000
    room = 3 * 16 + 8  # 3 sequences fit, not 4
    stats = {"bytes_limit": limit, "bytes_in_use": 0}
    path = tmp_path / "stats.json"
    path.write_text(json.dumps(stats))
    monkeypatch.setenv(FAKE_STATS_ENV, str(path))
    cache = WeightCache(limit)
    memory = DeviceMemory(jax.devices()[0], cache, explicit=True, fraction=0.9)
    cache.resize(limit - int(MARGIN * limit) - room)  # the explicit budget leaves `room`
    states = SequenceStates(memory=memory)
    for corrid in (1, 2, 3):
        states.rows("acc", manifest, [corrid, True, False], _ones)
    assert memory.state_bytes == 48
    with pytest.raises(UnavailableError, match="does not fit the device budget") as info:
        states.rows("acc", manifest, [4, True, False], _ones)
    assert info.value.status is Status.UNAVAILABLE
    assert "sequence state 64 bytes" in info.value.message, info.value.message
    assert memory.state_bytes == 48 and states.nbytes() == {"acc": 48}
    states.rows("acc", manifest, [2, True, False], _ones)  # START again: the same bytes
    assert memory.state_bytes == 48
    states.store("acc", [1, False, True], [jax.numpy.zeros((1, 4))])  # END frees one
    assert memory.state_bytes == 32
    states.rows("acc", manifest, [4, True, False], _ones)
    states.drop_bundle("acc")
    assert memory.state_bytes == 0


def test_state_takes_its_bytes_out_of_a_budget_sized_from_the_card(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = parse_manifest(copy.deepcopy(VALID))
    limit = 1000
    path = tmp_path / "stats.json"
    path.write_text(json.dumps({"bytes_limit": limit, "bytes_in_use": 0}))
    monkeypatch.setenv(FAKE_STATS_ENV, str(path))
    cache = WeightCache(limit)
    memory = DeviceMemory(jax.devices()[0], cache, explicit=False, fraction=0.9)
    states = SequenceStates(memory=memory)
    states.rows("acc", manifest, [1, True, False], _ones)
    assert cache.budget_bytes == limit - int(MARGIN * limit) - 16  # state out of the budget
    states.store("acc", [1, False, True], [jax.numpy.zeros((1, 4))])
    assert cache.budget_bytes == limit - int(MARGIN * limit)  # back at END
    for corrid in range(2, 2 + (limit - int(MARGIN * limit)) // 16):
        states.rows("acc", manifest, [corrid, True, False], _ones)
    with pytest.raises(UnavailableError, match="weight budget"):
        states.rows("acc", manifest, [0, True, False], _ones)
