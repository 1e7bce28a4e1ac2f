"""``lpt_packing`` placement: which workers hold which model, and when to repack (pure logic).

The rules are ReactantServer's ``compute_assignment`` (ReactantServer.jl,
``packages/ReactantServerGateway/src/lpt_packing.jl``): Graham's LPT list scheduling over two
dimensions, compute share and weight memory (docs/gateway.md, "Placement (lpt_packing)").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

#: Pressures closer than this compare equal, so that float residue does not break ties.
_EPS = 1e-12


@dataclass(frozen=True)
class ModelLoad:
    """One model to pack: items/s, seconds per item, weight bytes (per replica), replicas."""

    name: str
    arrival_rate: float = 0.0
    cost_per_item_seconds: float = 0.0
    weight_bytes: int = 0
    replicas: int | Literal["all"] = 1

    @property
    def utilization(self) -> float:
        """Compute seconds per second the model needs: arrival rate x cost per item."""
        return self.arrival_rate * self.cost_per_item_seconds


@dataclass(frozen=True)
class WorkerCapacity:
    """One worker: weight budget (bytes; 0 = unconstrained), capacity (1.0 = one GPU)."""

    name: str
    weight_budget_bytes: int = 0
    compute_capacity: float = 1.0


@dataclass(frozen=True)
class Placement:
    """Result of one packing: model -> workers (in the order chosen), worker -> compute share
    and weight bytes, the models moved or held by hysteresis, and warnings.
    """

    assignment: Mapping[str, tuple[str, ...]]
    compute_share: Mapping[str, float]
    weight_bytes: Mapping[str, int]
    moved: tuple[str, ...] = ()
    held_by_hysteresis: tuple[str, ...] = ()
    warnings: tuple[str, ...] = field(default=())


def _memory_share(used: int, budget: int) -> float:
    return used / budget if budget > 0 else 0.0


def _slot_key(
    worker: WorkerCapacity, model: ModelLoad, share: float, compute: float, memory: int
) -> tuple[float, float]:
    """(pressure, memory share) after a replica of ``model`` on ``worker`` (reversed if cold)."""
    mem = _memory_share(memory + model.weight_bytes, worker.weight_budget_bytes)
    pressure = max((compute + share) / worker.compute_capacity, mem)
    first, second = (mem, pressure) if model.utilization == 0.0 else (pressure, mem)
    return (round(first / _EPS) * _EPS, second)


def compute_placement(
    models: Sequence[ModelLoad],
    workers: Sequence[WorkerCapacity],
    *,
    previous: Mapping[str, Sequence[str]] | None = None,
    hysteresis: float = 0.0,
    forbid_memory_oversubscription: bool = True,
) -> Placement:
    """Place every model on its replica count of distinct workers (docs/gateway.md, "Placement
    (lpt_packing)").

    Raises:
        ValueError: no workers, duplicate worker names, or hysteresis outside [0, 1).
    """
    if not workers:
        raise ValueError("compute_placement needs at least one worker")
    names = [w.name for w in workers]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate worker names: {names}")
    if not 0.0 <= hysteresis < 1.0:
        raise ValueError(f"hysteresis must be in [0, 1), got {hysteresis}")
    previous = previous or {}
    index = {w.name: i for i, w in enumerate(workers)}
    compute = {w.name: 0.0 for w in workers}
    memory = {w.name: 0 for w in workers}
    placed = {w.name: 0 for w in workers}
    warnings: list[str] = []
    held: list[str] = []
    assignment: dict[str, tuple[str, ...]] = {}
    n = len(workers)

    ordered = sorted(models, key=lambda m: (-m.utilization, -m.weight_bytes, m.name))
    for model in ordered:
        if model.replicas == "all":
            k = n
        else:
            k = max(1, min(model.replicas, n))
            if model.replicas > n:
                warnings.append(
                    f"model {model.name}: {model.replicas} replicas asked, {n} workers exist;"
                    f" placed on {n}"
                )
        share = model.utilization / k
        home = set(previous.get(model.name, ()))
        chosen: list[str] = []
        was_held = False
        for _ in range(k):
            candidates = [w for w in workers if w.name not in chosen]
            fits = [
                w
                for w in candidates
                if w.weight_budget_bytes == 0
                or memory[w.name] + model.weight_bytes <= w.weight_budget_bytes
            ]
            if forbid_memory_oversubscription:
                if fits:
                    candidates = fits
                else:
                    warnings.append(
                        f"model {model.name}: no worker has room for {model.weight_bytes} bytes"
                        " of weights; placed over budget"
                    )

            keys = {
                w.name: (
                    *_slot_key(w, model, share, compute[w.name], memory[w.name]),
                    placed[w.name],
                    index[w.name],
                )
                for w in candidates
            }
            best = min(keys, key=keys.__getitem__)
            homes = [w.name for w in candidates if w.name in home]
            pick = best
            if homes:
                best_home = min(homes, key=keys.__getitem__)
                if keys[best_home][0] * (1.0 - hysteresis) <= keys[best][0] + _EPS:
                    pick = best_home
                    if keys[best_home][0] > keys[best][0] + _EPS:
                        was_held = True
            chosen.append(pick)
            placed[pick] += 1
            compute[pick] += share
            memory[pick] += model.weight_bytes
        assignment[model.name] = tuple(chosen)
        if was_held:
            held.append(model.name)

    for w in workers:
        if w.weight_budget_bytes and memory[w.name] > w.weight_budget_bytes:
            warnings.append(
                f"worker {w.name}: {memory[w.name]} bytes of weights assigned over a budget of"
                f" {w.weight_budget_bytes}"
            )
    moved = [m for m, ws in assignment.items() if m in previous and set(previous[m]) != set(ws)]
    return Placement(
        assignment=assignment,
        compute_share={w.name: compute[w.name] / w.compute_capacity for w in workers},
        weight_bytes=memory,
        moved=tuple(sorted(moved)),
        held_by_hysteresis=tuple(sorted(held)),
        warnings=tuple(warnings),
    )


class RepackClock:
    """Decides when traffic calls for a repack: once the fleet compute-seconds reach the budget
    (:attr:`budget_seconds`); an idle fleet never repacks. Not thread-safe.
    """

    def __init__(
        self, rebalance_compute_seconds: float, first_rebalance_compute_seconds: float = 0.0
    ) -> None:
        self.retune(rebalance_compute_seconds, first_rebalance_compute_seconds)
        self.accumulated_seconds = 0.0
        self.repacks = 0

    def retune(
        self, rebalance_compute_seconds: float, first_rebalance_compute_seconds: float
    ) -> None:
        """Set the budgets, keeping the compute accumulated so far.

        Raises:
            ValueError: ``rebalance_compute_seconds`` <= 0 or ``first`` < 0.
        """
        if rebalance_compute_seconds <= 0:
            raise ValueError(
                f"rebalance_compute_seconds must be > 0, got {rebalance_compute_seconds}"
            )
        if first_rebalance_compute_seconds < 0:
            raise ValueError(
                "first_rebalance_compute_seconds must be >= 0, got"
                f" {first_rebalance_compute_seconds}"
            )
        self._rebalance = rebalance_compute_seconds
        self._first = first_rebalance_compute_seconds

    @property
    def budget_seconds(self) -> float:
        """Compute seconds the next traffic-driven repack waits for."""
        return self._first if self.repacks == 0 and self._first > 0 else self._rebalance

    def advance(self, fleet_compute_seconds: float) -> bool:
        """Add one tick's fleet compute-seconds; True when a repack is due (then resets)."""
        if fleet_compute_seconds <= 0:
            return False
        self.accumulated_seconds += fleet_compute_seconds
        if self.accumulated_seconds + _EPS < self.budget_seconds:
            return False
        self.accumulated_seconds = 0.0
        self.repacks += 1
        return True
