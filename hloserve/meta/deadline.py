"""A meta run's deadline: the client's timeout, counted from when the run starts.

The client's budget reaches a Python-based backend as the KServe request parameter ``timeout``
(microseconds; ``timeout=`` of tritonclient's ``infer``), read with ``request.timeout()``; 0
means none. The gRPC deadline of the call (``client_timeout``) is not visible to a backend.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hloserve.errors import DeadlineExceededError


@dataclass(frozen=True)
class Deadline:
    """When a run must be done, on a monotonic clock; ``expires_at`` None means never.

    Attributes:
        expires_at: the clock's reading at the deadline, seconds, or None.
        clock: the clock (``time.monotonic``; injectable for tests).
    """

    expires_at: float | None
    clock: Callable[[], float] = field(default=time.monotonic, compare=False)

    @classmethod
    def after_us(cls, timeout_us: int, clock: Callable[[], float] = time.monotonic) -> Deadline:
        """The deadline ``timeout_us`` microseconds from now; 0 (or less) means none."""
        if timeout_us <= 0:
            return cls(None, clock)
        return cls(clock() + timeout_us / 1e6, clock)

    def remaining_s(self) -> float | None:
        """Seconds left (negative once passed), or None without a deadline."""
        return None if self.expires_at is None else self.expires_at - self.clock()

    def remaining_us(self) -> int:
        """Whole microseconds left for a sub-request's ``timeout``: >= 1, or 0 without one."""
        left = self.remaining_s()
        return 0 if left is None else max(1, int(left * 1e6))

    def check(self, model: str, before: str) -> None:
        """Raise unless time is left.

        Args:
            model: the meta model, for error text.
            before: what was about to happen, e.g. ``"calling model 'strong'"``.

        Raises:
            DeadlineExceededError: the deadline has passed.
        """
        left = self.remaining_s()
        if left is not None and left <= 0:
            raise DeadlineExceededError(
                f"model {model!r}: deadline exceeded before {before} "
                f"({-left * 1e3:.1f} ms past the client's timeout)"
            )


__all__ = ["Deadline"]
