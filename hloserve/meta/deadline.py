"""A meta run's deadline: the client's KServe ``timeout`` (us), counted from the run's start."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hloserve.errors import DeadlineExceededError


@dataclass(frozen=True)
class Deadline:
    """When a run must be done: ``clock()`` reading in seconds, None for never."""

    expires_at: float | None
    clock: Callable[[], float] = field(default=time.monotonic, compare=False)

    @classmethod
    def after_us(cls, timeout_us: int, clock: Callable[[], float] = time.monotonic) -> Deadline:
        """The deadline ``timeout_us`` microseconds from now; 0 (or less) means none."""
        return cls(None if timeout_us <= 0 else clock() + timeout_us / 1e6, clock)

    def remaining_s(self) -> float | None:
        """Seconds left (negative once passed), or None without a deadline."""
        return None if self.expires_at is None else self.expires_at - self.clock()

    def remaining_us(self) -> int:
        """Whole microseconds left for a sub-request's ``timeout``: >= 1, or 0 without one."""
        left = self.remaining_s()
        return 0 if left is None else max(1, int(left * 1e6))

    def check(self, model: str, before: str) -> None:
        """Raise unless time is left (``before``: e.g. ``"calling model 'strong'"``); raises
        DeadlineExceededError: the deadline has passed."""
        left = self.remaining_s()
        if left is not None and left <= 0:
            raise DeadlineExceededError(
                f"model {model!r}: deadline exceeded before {before} "
                f"({-left * 1e3:.1f} ms past the client's timeout)"
            )
