"""Settings of the runtime's scheduler (docs/scheduling.md, "Settings"). Pure Python."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal, cast

from hloserve import names
from hloserve.model_parameters import RuntimeParameters

if TYPE_CHECKING:  # a type only: this module stays pure Python
    from hloserve.model_parameters import ModelArgs

Discipline = Literal["fair", "fifo", "edf"]
#: The disciplines, the default first (docs/scheduling.md, "Disciplines").
DISCIPLINES = cast(tuple[Discipline, ...], names.SCHEDULING_DISCIPLINES)
#: Weight of a model :attr:`SchedulerConfig.weights` does not list.
DEFAULT_WEIGHT = 1.0


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclass(frozen=True)
class SchedulerConfig:
    """Scheduler settings (docs/scheduling.md, "Settings"; defaults are ReactantServer's);
    unlisted models weigh :data:`DEFAULT_WEIGHT`; ValueError (naming the field) for a value out
    of range."""

    discipline: Discipline = "fair"
    weights: Mapping[str, float] = field(default_factory=dict)
    ema_half_life_s: float = 30.0
    priority_cap: float = 0.25
    coalescing_discount: float = 0.10
    unseeded_cost_s: float = 0.01
    cost_ema_alpha: float = 0.2

    def __post_init__(self) -> None:
        _check(
            self.discipline in DISCIPLINES,
            f"scheduling discipline {self.discipline!r} is not one of {list(DISCIPLINES)}",
        )
        for model, weight in self.weights.items():
            _check(
                math.isfinite(weight) and weight > 0,
                f"weight of model {model!r} must be a finite number > 0, got {weight!r}",
            )
        _check(self.ema_half_life_s > 0, f"ema_half_life_s must be > 0, got {self.ema_half_life_s}")
        _check(
            0 < self.priority_cap <= 1, f"priority_cap must be in (0, 1], got {self.priority_cap}"
        )
        _check(
            0 <= self.coalescing_discount < 1,
            f"coalescing_discount must be in [0, 1), got {self.coalescing_discount}",
        )
        _check(self.unseeded_cost_s > 0, f"unseeded_cost_s must be > 0, got {self.unseeded_cost_s}")
        _check(
            0 < self.cost_ema_alpha <= 1,
            f"cost_ema_alpha must be in (0, 1], got {self.cost_ema_alpha}",
        )
        object.__setattr__(self, "weights", MappingProxyType(dict(self.weights)))

    def weight(self, model: str) -> float:
        """``model``'s weight (:data:`DEFAULT_WEIGHT` when unlisted)."""
        return self.weights.get(model, DEFAULT_WEIGHT)

    @classmethod
    def from_parameters(
        cls, parameters: Mapping[str, str], *, model: str = names.RUNTIME_MODEL
    ) -> SchedulerConfig:
        """The config of the runtime model's parameters ``names.PARAM_SCHEDULING`` and
        ``names.PARAM_MODEL_WEIGHTS``; InvalidArgumentError (naming ``model`` and the parameter)
        for an unknown discipline or a bad weight."""
        discipline = RuntimeParameters.read(model, parameters, names.PARAM_SCHEDULING)
        weights = RuntimeParameters.read(model, parameters, names.PARAM_MODEL_WEIGHTS)
        return cls(discipline=cast(Discipline, discipline), weights=weights)

    def to_parameters(self) -> dict[str, str]:
        """Inverse of :meth:`from_parameters` (its two keys; the other fields are not written)."""
        written = RuntimeParameters(scheduling=self.discipline, model_weights=self.weights)
        keys = (names.PARAM_SCHEDULING, names.PARAM_MODEL_WEIGHTS)
        return {k: v for k, v in written.to_parameters().items() if k in keys}


def scheduler_config_from_args(args: ModelArgs) -> SchedulerConfig:
    """The scheduler settings of the runtime's config; InvalidArgumentError as above."""
    return SchedulerConfig.from_parameters(args.parameters, model=args.name)
