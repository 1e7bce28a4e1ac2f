"""Merging of per-worker ``ModelStatistics`` into the fleet's (pure, no gRPC).

Triton reports statistics per server (``inference.ModelStatistics`` in ``grpc_service.proto``);
the gateway answers ``ModelStatistics`` with the sum over workers, one row per
(name, version): counters and durations are added, ``last_inference`` (ms since the epoch) is
the latest, ``batch_stats`` rows are matched by ``batch_size``, ``response_stats`` by key, and
``memory_usage`` rows are concatenated (one per worker device).
"""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from tritonclient.grpc import service_pb2

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
