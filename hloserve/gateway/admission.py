"""Admission: bounds on what the gateway holds in flight (docs/gateway.md, "Admission").

Two bounds, both optional: ModelInfer calls in flight over the whole gateway, and items (the
batch extent) of one model in flight over all its replicas. A request over a bound is refused
at once with :class:`~hloserve.errors.UnavailableError` (Triton answers UNAVAILABLE when a
model's queue is full), naming the model and the bound; nothing waits in the gateway.
Transport-neutral and thread-safe.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from hloserve.errors import UnavailableError


@dataclass
class Ticket:
    """One admitted request; hand it back with :meth:`Admission.release`."""

    model: str
    items: int
    released: bool = False


class Admission:
    """Counts requests and items in flight and refuses those over a bound.

    Args:
        max_requests: ModelInfer calls in flight over the gateway; 0 = unbounded.
        max_items_per_model: items of one model in flight; 0 = unbounded. A single request
            larger than the bound is admitted when nothing of its model is in flight (else it
            could never run).
    """

    def __init__(self, max_requests: int = 0, max_items_per_model: int = 0) -> None:
        self.max_requests = max_requests
        self.max_items_per_model = max_items_per_model
        self._lock = threading.Lock()
        self._requests = 0
        self._items: dict[str, int] = {}
        self.refused = 0

    def admit(self, model: str, items: int) -> Ticket:
        """Admit a request of ``items`` items for ``model`` or refuse it.

        Raises:
            UnavailableError: a bound is reached; the message names the model and the bound.
        """
        items = max(1, items)
        with self._lock:
            if self.max_requests and self._requests >= self.max_requests:
                self.refused += 1
                raise UnavailableError(
                    f"model {model!r}: request exceeds the gateway's limit of "
                    f"{self.max_requests} requests in flight; retry later"
                )
            held = self._items.get(model, 0)
            if self.max_items_per_model and held and held + items > self.max_items_per_model:
                self.refused += 1
                raise UnavailableError(
                    f"model {model!r}: request of {items} items exceeds the limit of "
                    f"{self.max_items_per_model} items in flight for the model "
                    f"({held} in flight); retry later"
                )
            self._requests += 1
            self._items[model] = held + items
            return Ticket(model, items)

    def release(self, ticket: Ticket) -> None:
        """Free an admitted request (idempotent)."""
        with self._lock:
            if ticket.released:
                return
            ticket.released = True
            self._requests -= 1
            left = self._items[ticket.model] - ticket.items
            if left:
                self._items[ticket.model] = left
            else:
                del self._items[ticket.model]

    def in_flight(self) -> tuple[int, dict[str, int]]:
        """Requests in flight and items in flight per model."""
        with self._lock:
            return self._requests, dict(self._items)
