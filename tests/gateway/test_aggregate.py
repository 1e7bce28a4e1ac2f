"""Fleet ModelStatistics = the sum of the workers' (issue 5: ModelStatistics aggregate); the
fleet's repository index = the workers' merged (issue 12: the same rule for gRPC and HTTP)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from google.protobuf import json_format
from tritonclient.grpc import service_pb2

from hloserve.gateway.aggregate import (
    merge_model_statistics,
    merge_repository_index,
    merge_statistics_json,
)


def _stats(
    name: str, count: int, ns: int, last: int, batches: dict[int, int]
) -> service_pb2.ModelStatisticsResponse:
    response = service_pb2.ModelStatisticsResponse()
    row = response.model_stats.add(
        name=name, version="1", last_inference=last, inference_count=count, execution_count=count
    )
    row.inference_stats.success.count = count
    row.inference_stats.success.ns = ns
    for size, n in batches.items():
        batch = row.batch_stats.add(batch_size=size)
        batch.compute_infer.count = n
        batch.compute_infer.ns = 10 * n
    row.response_stats["0"].success.count = count
    row.memory_usage.add(type="GPU", id=0, byte_size=count)
    return response


def test_counters_add_last_inference_is_latest_batches_match_by_size() -> None:
    merged = merge_model_statistics(
        [
            _stats("m", 3, 300, 1000, {1: 2, 4: 1}),
            _stats("m", 5, 700, 900, {4: 3}),
            _stats("a", 1, 10, 5, {}),
        ]
    )
    assert [(r.name, r.version) for r in merged.model_stats] == [("a", "1"), ("m", "1")]
    m = merged.model_stats[1]
    assert m.inference_count == 8 and m.execution_count == 8
    assert m.last_inference == 1000
    assert (m.inference_stats.success.count, m.inference_stats.success.ns) == (8, 1000)
    batches = {b.batch_size: (b.compute_infer.count, b.compute_infer.ns) for b in m.batch_stats}
    assert batches == {1: (2, 20), 4: (4, 40)}
    assert m.response_stats["0"].success.count == 8
    assert [u.byte_size for u in m.memory_usage] == [3, 5]


def test_nothing_to_merge() -> None:
    assert len(merge_model_statistics([]).model_stats) == 0


def test_repository_index_merges_by_name_and_version_ready_wins() -> None:
    """Triton's HTTP rows (dicts, keys as the worker wrote them) and gRPC rows alike."""
    failed = {"name": "m", "version": "1", "state": "UNAVAILABLE", "reason": "load failed"}
    ready = {"name": "m", "version": "1", "state": "READY"}
    worker0 = [{"name": "b", "version": "1", "state": "READY"}, failed]
    worker1 = [ready, {"name": "a", "version": "1", "state": "READY"}, {"name": "m"}]
    merged = merge_repository_index(
        [worker0, worker1],
        key=lambda row: (row["name"], row.get("version", "")),
        state=lambda row: row.get("state", ""),
    )
    assert merged == [worker1[1], worker0[0], worker1[2], ready]  # sorted; "m" "" before "1"
    broken = {"name": "x", "version": "1", "state": "UNAVAILABLE", "reason": "first"}
    later = {"name": "x", "version": "1", "state": "UNAVAILABLE", "reason": "second"}
    assert merge_repository_index([[broken], [later]], lambda r: ("x", "1"), lambda r: "") == [
        broken
    ]
    rows = [service_pb2.RepositoryIndexResponse.ModelIndex(name="g", version="1", state="READY")]
    pair = merge_repository_index([rows, rows], lambda r: (r.name, r.version), lambda r: r.state)
    assert pair == rows
    assert merge_repository_index([], lambda r: ("", ""), lambda r: "") == []


def _as_triton_json(message: Any) -> Any:
    """A message as Triton's KServe HTTP JSON: proto field names, integers as numbers
    (protobuf's JSON form writes 64-bit integers as strings)."""

    def numbers(value: Any) -> Any:
        if isinstance(value, dict):  # name and version are strings in Triton's JSON too
            return {k: v if k in ("name", "version") else numbers(v) for k, v in value.items()}
        if isinstance(value, list):
            return [numbers(v) for v in value]
        if isinstance(value, str) and value.isdigit():
            return int(value)
        return value

    return numbers(json_format.MessageToDict(message, preserving_proto_field_name=True))


def test_http_statistics_sum_by_the_rules_of_grpc() -> None:
    """The JSON merge of the workers' HTTP answers is the gRPC merge, written as Triton's JSON;
    the inputs are left as they were."""
    responses = [
        _stats("m", 3, 300, 1000, {1: 2, 4: 1}),
        _stats("m", 5, 700, 900, {4: 3}),
        _stats("a", 1, 10, 5, {}),
    ]
    as_json = [_as_triton_json(r) for r in responses]
    before = copy.deepcopy(as_json)
    merged = merge_statistics_json(as_json)
    assert merged == _as_triton_json(merge_model_statistics(responses))
    assert merged["model_stats"][1]["inference_count"] == 8
    assert merged["model_stats"][1]["batch_stats"][1]["compute_infer"] == {"count": 4, "ns": 40}
    assert as_json == before
    assert merge_statistics_json([]) == {"model_stats": []}


@pytest.mark.parametrize("bad", [{}, {"model_stats": {}}, {"model_stats": [1]}, []])
def test_http_statistics_that_are_not_tritons_json_are_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match="model_stats"):
        merge_statistics_json([bad])


def test_a_worker_without_statistics_adds_nothing() -> None:
    row = service_pb2.ModelStatistics(name="m", version="1", inference_count=3)
    one = service_pb2.ModelStatisticsResponse(model_stats=[row])
    merged = merge_model_statistics([service_pb2.ModelStatisticsResponse(), one])
    assert merged == one
