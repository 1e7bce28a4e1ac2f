"""Merging per-worker ``ModelStatistics`` and ``RepositoryIndex`` answers into the fleet's.

Statistics (gRPC or KServe HTTP JSON) are summed per (name, version): counters and durations
added, ``last_inference`` the latest, ``batch_stats`` matched by ``batch_size``, maps by key.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from tritonclient.grpc import service_pb2

#: A repository index row: a ``RepositoryIndexResponse.ModelIndex`` or Triton's HTTP JSON.
Row = TypeVar("Row")

#: Repeated message fields whose rows are matched by a key field instead of concatenated.
_KEYED = {"batch_stats": "batch_size"}
#: Integer fields that take the largest value instead of the sum.
_LATEST = {"last_inference"}


def _as_json(message: Message) -> dict[str, Any]:

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
    """Sum several workers' ``ModelStatistics`` per (name, version), sorted."""
    merged = merge_statistics_json({"model_stats": [], **_as_json(r)} for r in responses)
    return json_format.ParseDict(merged, service_pb2.ModelStatisticsResponse())


def _add_json(dst: dict[str, Any], src: Mapping[str, Any], skip: str = "") -> None:
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
    """Sum several workers' KServe HTTP statistics per (name, version), sorted.

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
            _add_json(rows.setdefault(key, {"name": key[0], "version": key[1]}), row)
    return {"model_stats": [rows[k] for k in sorted(rows)]}


def merge_repository_index(
    indexes: Iterable[Iterable[Row]],
    key: Callable[[Row], tuple[str, str]],
    state: Callable[[Row], str],
) -> list[Row]:
    """Workers' indexes as one row per (name, version), sorted: the last READY, else the first."""
    merged: dict[tuple[str, str], Row] = {}
    for rows in indexes:
        for row in rows:
            name_version = key(row)
            if name_version not in merged or state(row) == "READY":
                merged[name_version] = row
    return [merged[k] for k in sorted(merged)]
