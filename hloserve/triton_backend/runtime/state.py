"""What the runtime publishes besides execution counts (:class:`RuntimeState`; the metrics
are docs/observability.md's), assembled from a scheduler snapshot."""

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
    """What the runtime publishes every flush besides execution counts: per (model, variant)
    real and padding rows, sheds per (model, reason), scheduler snapshots by model, learned
    costs (s), device memory figures (None on CPU), bytes of live sequences' state."""

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
    """The :class:`RuntimeState` of one publishing round, from the scheduler's snapshot (by
    bundle key) and the bundles held under each key."""
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
