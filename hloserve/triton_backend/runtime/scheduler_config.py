"""Settings of the runtime's scheduler and request deadlines (docs/scheduling.md).

:class:`SchedulerConfig` comes from the runtime model's config parameters
(:meth:`SchedulerConfig.from_parameters`, :func:`scheduler_config_from_args` for the runtime's
``initialize`` arguments); :func:`deadline_from_parameters` turns a request's
KServe ``timeout`` parameter into a deadline on the monotonic clock. Pure Python.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal, cast

from hloserve import names
from hloserve.errors import InvalidArgumentError
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
    """Scheduler settings (docs/scheduling.md); every default is ReactantServer's.

    Attributes:
        discipline: ``"fair"`` (default), ``"fifo"`` or ``"edf"``.
        weights: model -> weight (> 0, finite); unlisted models weigh :data:`DEFAULT_WEIGHT`.
            Only ``fair`` reads them.
        ema_half_life_s: half-life of the per-model recent-compute EMA, seconds (> 0).
        priority_cap: clamp of ``share - normalized EMA``, in (0, 1].
        coalescing_discount: ``fair`` divides by ``cost * (1 - discount)`` when the planned
            batch coalesces several requests, in [0, 1).
        unseeded_cost_s: cost estimate of a (model, variant, batch size) never measured, s (> 0).
        cost_ema_alpha: weight of a new measurement in the cost EMA, in (0, 1].

    Raises:
        ValueError: a value outside its range (the message names the field).
    """

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
        """The config the runtime model's parameters give (docs/scheduling.md, "Settings").

        Args:
            parameters: the runtime model's config parameters as text (``string_value``):
                ``names.PARAM_SCHEDULING`` (a discipline; absent or "" = ``fair``) and
                ``names.PARAM_MODEL_WEIGHTS`` (``"<model>=<weight>,..."``; absent = all 1.0),
                read by :class:`~hloserve.model_parameters.RuntimeParameters`. Other keys are
                ignored.
            model: the runtime model's name, for error messages.

        Raises:
            InvalidArgumentError: an unknown discipline or a malformed or non-positive weight
                (the model and the parameter are named).
        """
        discipline = RuntimeParameters.read(model, parameters, names.PARAM_SCHEDULING)
        weights = RuntimeParameters.read(model, parameters, names.PARAM_MODEL_WEIGHTS)
        return cls(discipline=cast(Discipline, discipline), weights=weights)

    def to_parameters(self) -> dict[str, str]:
        """Inverse of :meth:`from_parameters` for the two keys it reads (the other fields are
        not written: a repository always gets their defaults)."""
        written = RuntimeParameters(scheduling=self.discipline, model_weights=self.weights)
        keys = (names.PARAM_SCHEDULING, names.PARAM_MODEL_WEIGHTS)
        return {k: v for k, v in written.to_parameters().items() if k in keys}


def deadline_from_parameters(params: Mapping[str, object], now: float) -> float | None:
    """A request's deadline from its KServe ``timeout`` parameter (docs/scheduling.md, "Deadlines").

    Args:
        params: the request's parameters (a mapping of name to value, as the Python backend's
            ``request.parameters()`` JSON decodes to).
        now: the monotonic time (seconds) the request arrived.

    Returns:
        ``now + timeout`` in seconds, the timeout being in microseconds (Triton's
        "timeout" request parameter, docs/protocol/extension_parameters.md); None when there
        is no ``timeout`` or it is 0 (Triton's "no timeout").

    Raises:
        InvalidArgumentError: ``timeout`` is not a non-negative integer.
    """
    value = params.get("timeout")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidArgumentError(
            f"request parameter 'timeout' must be an integer number of microseconds, got {value!r}"
        )
    try:
        micros = int(value)
    except ValueError:
        raise InvalidArgumentError(
            f"request parameter 'timeout' must be an integer number of microseconds, got {value!r}"
        ) from None
    if micros < 0:
        raise InvalidArgumentError(f"request parameter 'timeout' must be >= 0, got {micros}")
    return None if micros == 0 else now + micros / 1e6


def scheduler_config_from_args(args: ModelArgs) -> SchedulerConfig:
    """The scheduler settings of the runtime's config (docs/scheduling.md, "Settings").

    Raises:
        InvalidArgumentError: an unknown discipline or a malformed weight.
    """
    return SchedulerConfig.from_parameters(args.parameters, model=args.name)
