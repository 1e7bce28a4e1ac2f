"""Manifest ``state``: rules on the pairs, the wire tensors, and a stateful export from JAX."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from hloserve.bundle.bundle import load_bundle
from hloserve.bundle.manifest import ManifestError, parse_manifest
from hloserve.bundle.validate import validate_bundle
from tests.accumulator_bundle import export_accumulator
from tests.conftest import needs_tritonclient

ROW = {"dtype": "f32", "shape": "nk", "dims": {"k": 4}}
VALID: dict[str, Any] = {
    "format_version": 4,
    "inputs": [{"name": "s", **ROW}, {"name": "x", **ROW}],
    "outputs": [{"name": "y", **ROW}, {"name": "s_next", **ROW}],
    "batching": {"compiled_batch_sizes": [1, 8]},
    "executables": {1: "a.mlirbc", 8: "b.mlirbc"},
    "state": [{"input": "s", "output": "s_next"}],
}


def refused(change: Any) -> str:
    data = copy.deepcopy(VALID)
    change(data)
    with pytest.raises(ManifestError) as info:
        parse_manifest(data)
    return str(info.value)


def test_state_is_not_on_the_wire() -> None:
    m = parse_manifest(copy.deepcopy(VALID))
    assert m.stateful and m.state[0].initial_weight is None
    assert [s.name for s in m.wire_inputs] == ["x"]
    assert [s.name for s in m.wire_outputs] == ["y"]
    assert "state:" in m.to_yaml() and parse_manifest(copy.deepcopy(VALID)) == m


def test_state_rules_name_their_cause() -> None:
    assert "state needs format_version 4" in refused(lambda d: d.update(format_version=3))
    assert "input 'q' is not in inputs" in refused(lambda d: d["state"][0].update(input="q"))
    assert "output 'y2' is not in outputs" in refused(lambda d: d["state"][0].update(output="y2"))
    assert "differ in dtype or shape" in refused(lambda d: d["outputs"][1].update(dtype="f16"))
    assert "initial weight 'w' is not in weights.order" in refused(
        lambda d: d["state"][0].update(initial="weight:w")
    )
    assert "initial must be 'zeros' or 'weight:NAME'" in refused(
        lambda d: d["state"][0].update(initial="ones")
    )
    assert "state repeats input ['s']" in refused(
        lambda d: d["state"].append({"input": "s", "output": "y"})
    )


def test_exported_accumulator_validates(tmp_path: Path) -> None:
    path = export_accumulator(tmp_path / "accumulator")
    bundle = load_bundle(path)
    assert bundle.manifest.format_version == 4
    assert [(s.input, s.output) for s in bundle.manifest.state] == [("s", "s_next")]
    assert not [p for p in validate_bundle(path) if not p.warning]


@needs_tritonclient
def test_front_config_has_sequence_batching_without_triton_state() -> None:
    from hloserve.bundle.manifest_sections import MAX_SEQUENCE_IDLE_US
    from hloserve.model_repository_tools.build_options import BuildOptions
    from hloserve.model_repository_tools.config import front_config

    m = parse_manifest(copy.deepcopy(VALID))
    config = front_config("acc", m, BuildOptions(max_queue_delay_us=100))
    assert not config.HasField("dynamic_batching")
    # one instance by default: the sequence batcher coalesces sequences only within one
    assert [g.count for g in config.instance_group] == [1]
    three = front_config("acc", m, BuildOptions(front_instances=3))
    assert [g.count for g in three.instance_group] == [3]  # as asked
    seq = config.sequence_batching
    assert seq.max_sequence_idle_microseconds == MAX_SEQUENCE_IDLE_US
    # no CORRID: 2.51 writes a string ID past a UINT64 CORRID tensor (the front reads the ID
    # from the request instead, an int or a string)
    assert [c.name for c in seq.control_input] == ["START", "END", "READY"]
    assert all(list(c.control[0].int32_false_true) == [0, 1] for c in seq.control_input)
    assert list(seq.oldest.preferred_batch_size) == [8]  # 1 would send each request alone
    assert seq.oldest.max_candidate_sequences == 8
    assert seq.oldest.max_queue_delay_microseconds == 100
    assert not seq.state  # Triton's implicit state does not reach a Python-backend model
    assert [i.name for i in config.input] == ["x"] and [o.name for o in config.output] == ["y"]


@needs_tritonclient
def test_the_sequence_section_sets_the_sequence_batcher() -> None:
    """``sequence``: the idle timeout, the candidate sequences."""
    from hloserve.model_repository_tools.build_options import BuildOptions
    from hloserve.model_repository_tools.config import front_config

    data = copy.deepcopy(VALID)
    data["sequence"] = {
        "max_sequence_idle_microseconds": 250_000,
        "max_candidate_sequences": 64,
    }
    m = parse_manifest(data)
    assert "sequence:" in m.to_yaml() and parse_manifest(m.model_dump()) == m
    seq = front_config(
        "acc", m, BuildOptions(front_instances=1, max_queue_delay_us=100)
    ).sequence_batching
    assert seq.max_sequence_idle_microseconds == 250_000
    assert seq.oldest.max_candidate_sequences == 64
    assert "sequence: only for a stateful model" in refused(
        lambda d: (d.pop("state"), d.update(sequence={"max_candidate_sequences": 4}))
    )
    assert "correlation_id" in refused(lambda d: d.update(sequence={"correlation_id": "string"}))
    assert "greater than 0" in refused(
        lambda d: d.update(sequence={"max_sequence_idle_microseconds": 0})
    )
