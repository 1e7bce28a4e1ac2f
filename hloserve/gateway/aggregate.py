"""Merging of per-worker answers into the fleet's (pure, no gRPC): ``ModelStatistics`` and
``RepositoryIndex``.

Triton reports statistics per server (``inference.ModelStatistics`` in ``grpc_service.proto``);
the gateway answers ``ModelStatistics`` with the sum over workers, one row per
(name, version): counters and durations are added, ``last_inference`` (ms since the epoch) is
the latest, ``batch_stats`` rows are matched by ``batch_size``, ``response_stats`` by key, and
``memory_usage`` rows are concatenated (one per worker device). The repository index is merged
by (name, version), a READY row winning over the other states (:func:`merge_repository_index`,
for the gRPC messages and the KServe HTTP JSON alike). KServe HTTP statistics (Triton's JSON of
the same message, ``GET /v2/models[/{name}[/versions/{v}]]/stats``) are summed by the same
rules (:func:`merge_statistics_json`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from tritonclient.grpc import service_pb2

#: A repository index row: ``service_pb2.RepositoryIndexResponse.ModelIndex`` or Triton's
#: HTTP JSON object (``{"name", "version", "state", "reason"}``).
Row = TypeVar("Row")

#: Repeated message fields whose rows are matched by a key field instead of concatenated.
_KEYED = {"batch_stats": "batch_size"}
#: Integer fields that take the largest value instead of the sum.
_LATEST = {"last_inference"}


def _as_json(message: Message) -> dict[str, Any]:
    """A message as Triton's JSON of it (field names as in the proto, integers as ints)."""

    def value(fd: FieldDescriptor, v: Any) -> Any:
        return _as_json(v) if fd.message_type is not None else v

    out: dict[str, Any] = {}
    for fd, v in message.ListFields():
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            item = fd.message_type.fields_by_name["value"]
            out[fd.name] = {k: value(item, x) for k, x in v.items()}
        elif fd.label == FieldDescriptor.LABEL_REPEATED:
            out[fd.name] = [value(fd, x) for x in v]
        else:
            out[fd.name] = value(fd, v)
    return out


def merge_model_statistics(
    responses: Iterable[service_pb2.ModelStatisticsResponse],
) -> service_pb2.ModelStatisticsResponse:
    """Sum the ``ModelStatistics`` rows of several workers per (name, version), sorted
    (:func:`merge_statistics_json` on the messages' JSON)."""
    merged = merge_statistics_json({"model_stats": [], **_as_json(r)} for r in responses)
    return json_format.ParseDict(merged, service_pb2.ModelStatisticsResponse())


def _add_json(dst: dict[str, Any], src: Mapping[str, Any], skip: str = "") -> None:
    """:func:`_add` on Triton's JSON form of the message (objects, lists, numbers, strings)."""
    for name, value in src.items():
        if name == skip:
            continue
        if isinstance(value, list):
            target = dst.setdefault(name, [])
            if name in _KEYED:
                key_field = _KEYED[name]
                for item in value:
                    key = item.get(key_field)
                    match = next((t for t in target if t.get(key_field) == key), None)
                    if match is None:
                        target.append(copy.deepcopy(item))  # later workers add into it
                    else:
                        _add_json(match, item, skip=key_field)
            else:
                target.extend(value)
        elif isinstance(value, Mapping):  # a message, or a map (``response_stats``) by key
            _add_json(dst.setdefault(name, {}), value)
        elif type(value) is int and type(current := dst.get(name, 0)) is int:  # not bool
            dst[name] = max(current, value) if name in _LATEST else current + value
        elif not dst.get(name):
            dst[name] = value


def merge_statistics_json(responses: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Sum several workers' KServe HTTP statistics (``{"model_stats": [...]}`` as Triton writes
    it) per (name, version), sorted: the rules of :func:`merge_model_statistics`.

    Raises:
        ValueError: a response is not an object with a ``model_stats`` list of objects.
    """
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for response in responses:
        stats = response.get("model_stats") if isinstance(response, Mapping) else None
        if not isinstance(stats, list) or not all(isinstance(s, Mapping) for s in stats):
            raise ValueError("statistics are not an object with a 'model_stats' list of objects")
        for row in stats:
            key = (str(row.get("name", "")), str(row.get("version", "")))
            if key not in rows:
                rows[key] = {"name": key[0], "version": key[1]}
            _add_json(rows[key], row)
    return {"model_stats": [rows[k] for k in sorted(rows)]}


def merge_repository_index(
    indexes: Iterable[Iterable[Row]],
    key: Callable[[Row], tuple[str, str]],
    state: Callable[[Row], str],
) -> list[Row]:
    """Several workers' repository indexes as one: a row per (name, version), sorted.

    Args:
        indexes: each worker's rows, in worker order.
        key: a row's (name, version).
        state: a row's state (Triton's ``READY``, ``UNAVAILABLE``, ``LOADING``, ...).

    Returns:
        Per (name, version) the last READY row, else the first worker's row: a model ready on
        any worker reads READY, one that failed everywhere keeps the first worker's reason.
    """
    merged: dict[tuple[str, str], Row] = {}
    for rows in indexes:
        for row in rows:
            name_version = key(row)
            if name_version not in merged or state(row) == "READY":
                merged[name_version] = row
    return [merged[k] for k in sorted(merged)]
