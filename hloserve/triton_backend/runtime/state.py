"""What the runtime publishes besides execution counts (:class:`RuntimeState`, read into Triton
metrics by :mod:`hloserve.triton_backend.backends.metrics`; docs/observability.md), and how the
runtime server assembles it from a scheduler snapshot (:func:`runtime_state`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hloserve.triton_backend.runtime.loaded_bundle import LoadedBundle, variant_label
from hloserve.triton_backend.runtime.scheduler import SchedulerSnapshot

#: ``publish((model, variant label, batch size), executions since the last call)``.
Publish = Callable[[tuple[str, str, int], int], None]


@dataclass(frozen=True)
class RuntimeState:
    """What the runtime publishes once a second besides execution counts (metrics).

    Attributes:
        rows: (model, variant label) -> (real items, padding items) executed since the last one.
        shed: (model, reason) -> requests shed since the last one (``deadline``, ``laxity``,
            ``stopping``).
        models: model -> its scheduler snapshot (queue depth, share, recent compute).
        costs: (model, variant label, batch size) -> learned cost, seconds.
        memory: device memory by kind, bytes (``DeviceMemory.figures``); None on CPU.
        sequence_bytes: stateful model -> bytes of its live sequences' state (0 when none).
    """

    rows: dict[tuple[str, str], tuple[int, int]]
    shed: dict[tuple[str, str], int]
    models: dict[str, Any]
    costs: dict[tuple[str, str, int], float]
    memory: dict[str, int] | None = None
    sequence_bytes: dict[str, int] = field(default_factory=dict)


def runtime_state(
    snapshot: SchedulerSnapshot,
    loaded: Mapping[str, LoadedBundle],
    rows: Mapping[tuple[str, str], Sequence[int]],
    shed: Mapping[tuple[str, str], int],
    memory: dict[str, int] | None = None,
    sequence_bytes: Mapping[str, int] | None = None,
) -> RuntimeState:
    """The :class:`RuntimeState` of one publishing round.

    Args:
        snapshot: the scheduler's state now; its models go by key (``name`` or
            ``name#<generation>``).
        loaded: key -> the bundle held under it (names the model and its variants).
        rows: (model, variant label) -> ``[real items, padding items]`` since the last round.
        shed: (model, reason) -> requests shed since the last round.
        memory: device memory by kind, bytes; None on CPU.
        sequence_bytes: model name -> bytes of its live sequences' state.
    """
    models: dict[str, Any] = {}
    costs: dict[tuple[str, str, int], float] = {}
    for key, snap in snapshot.models.items():
        bundle = loaded.get(key)
        name = bundle.name if bundle is not None else key.partition("#")[0]
        models[name] = snap
        for (variant, size), seconds in snap.costs.items():
            dims = bundle.bundle.manifest.variant_dims[variant] if bundle is not None else {}
            costs[(name, variant_label(dims), size)] = seconds
    rows_out = {k: (v[0], v[1]) for k, v in rows.items()}
    held = {b.name: 0 for b in loaded.values() if b.bundle.manifest.stateful}
    held.update(sequence_bytes or {})
    return RuntimeState(rows_out, dict(shed), models, costs, memory, held)
