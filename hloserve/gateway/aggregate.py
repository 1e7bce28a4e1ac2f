"""Merging of per-worker answers into the fleet's (pure, no gRPC): ``ModelStatistics`` and
``RepositoryIndex``.

Triton reports statistics per server (``inference.ModelStatistics`` in ``grpc_service.proto``);
the gateway answers ``ModelStatistics`` with the sum over workers, one row per
(name, version): counters and durations are added, ``last_inference`` (ms since the epoch) is
the latest, ``batch_stats`` rows are matched by ``batch_size``, ``response_stats`` by key, and
``memory_usage`` rows are concatenated (one per worker device). The repository index is merged
by (name, version), a READY row winning over the other states (:func:`merge_repository_index`,
for the gRPC messages and the KServe HTTP JSON alike).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

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
_INTEGER_TYPES = {
    FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_UINT64,
}


def _add(dst: Message, src: Message, skip: str = "") -> None:
    for fd, value in src.ListFields():
        name = fd.name
        if name == skip:
            continue
        if fd.label == FieldDescriptor.LABEL_REPEATED:
            target = getattr(dst, name)
            if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
                for key, item in value.items():
                    _add(target[key], item)
            elif name in _KEYED:
                key_field = _KEYED[name]
                for item in value:
                    key = getattr(item, key_field)
                    match = next((t for t in target if getattr(t, key_field) == key), None)
                    if match is None:
                        target.add().CopyFrom(item)
                    else:
                        _add(match, item, skip=key_field)
            else:
                target.extend(value)
        elif fd.message_type is not None:
            _add(getattr(dst, name), value)
        elif fd.type in _INTEGER_TYPES:
            current = getattr(dst, name)
            setattr(dst, name, max(current, value) if name in _LATEST else current + value)
        elif not getattr(dst, name):
            setattr(dst, name, value)


def merge_model_statistics(
    responses: Iterable[service_pb2.ModelStatisticsResponse],
) -> service_pb2.ModelStatisticsResponse:
    """Sum the ``ModelStatistics`` rows of several workers per (name, version), sorted."""
    rows: dict[tuple[str, str], service_pb2.ModelStatistics] = {}
    for response in responses:
        for stats in response.model_stats:
            key = (stats.name, stats.version)
            if key not in rows:
                rows[key] = service_pb2.ModelStatistics(name=stats.name, version=stats.version)
            _add(rows[key], stats)
    merged = service_pb2.ModelStatisticsResponse()
    for key in sorted(rows):
        merged.model_stats.append(rows[key])
    return merged


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
