"""Residency tiers of a model's weights and the budget rule (docs/on_demand_weights.md,
"Residency tiers"); dependency-free, so every layer may import it."""

from __future__ import annotations

import enum
from collections.abc import Mapping

from hloserve.errors import InvalidArgumentError
from hloserve.units import format_size


class Residency(enum.Enum):
    """Where a model's weights live between executions (ReactantServer ``residency``)."""

    SYSTEM = "system"
    DEVICE = "device"
    UNPINNED = "unpinned"

    @classmethod
    def parse(cls, text: str, *, model: str = "") -> Residency:
        """The residency named ``text`` (any case); InvalidArgumentError for another name."""
        try:
            return cls(text.strip().lower())
        except ValueError:
            where = f"model {model!r}: " if model else ""
            raise InvalidArgumentError(
                f"{where}residency {text!r} is not one of {[r.value for r in cls]}"
            ) from None


def budget_problems(
    budget_bytes: int, weight_bytes: Mapping[str, int], residency: Mapping[str, str]
) -> list[str]:
    """What can never fit a weight cache budget of ``budget_bytes`` (> 0), one message per
    problem (empty: all fit): ``device`` models together must fit, every other model what they
    leave. ``residency``: model -> residency name (missing: ``system``)."""
    pinned = {
        name: n
        for name, n in sorted(weight_bytes.items())
        if Residency.parse(residency.get(name, "system"), model=name) is Residency.DEVICE
    }
    pinned_total = sum(pinned.values())
    budget = format_size(budget_bytes)
    problems = []
    if pinned_total > budget_bytes:
        if len(pinned) == 1:
            ((name, n),) = pinned.items()
            problems.append(
                f"weights of model {name!r} (residency=device) are {format_size(n)}, more than "
                f"the weight cache budget of {budget}"
            )
        else:
            which = ", ".join(f"{name!r} {format_size(n)}" for name, n in pinned.items())
            problems.append(
                f"the weights of the residency=device models ({which}) total "
                f"{format_size(pinned_total)}, more than the weight cache budget of {budget}"
            )
    room = max(budget_bytes - pinned_total, 0)
    for name, n in sorted(weight_bytes.items()):
        if name not in pinned and n > room:
            limit = f"the weight cache budget of {budget}"
            if pinned_total:  # what the pinned models leave of it, 0 when they overflow it
                limit = (
                    f"the {format_size(room)} the residency=device models leave of {limit} "
                    f"(they pin {format_size(pinned_total)})"
                )
            problems.append(f"weights of model {name!r} are {format_size(n)}, more than {limit}")
    return problems
