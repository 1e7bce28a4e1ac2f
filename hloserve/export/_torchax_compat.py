"""Import ``torchax`` 0.0.13 on torch 2.13, which removed the named-tensor operator overloads.

torch 2.13 dropped the ``Dimname`` overloads of ATen operators (``aten.prod.dim_Dimname``,
``aten.all.dimname``, ``aten.std.names_dim``, ... : 21 names that torchax 0.0.13 mentions).
torchax looks them up by attribute while it imports (its autocast table in ``torchax/amp.py``)
and while it builds its first environment (``torchax/decompositions.py``, the lowerings in
``torchax/ops/jaten.py``), so ``import torchax`` fails with ``AttributeError: The underlying op
of 'aten.prod' has no overload name 'dim_Dimname'``.

The fix upstream is to skip overloads that the installed torch does not have. Until a torchax
release does that, :func:`import_torchax` does it from outside: while torchax imports and builds
its default environment, a lookup of a *named-tensor* overload that does not exist returns an
inert placeholder (hashable, never dispatched to, because torch cannot produce a call to an
operator it does not have). Any other missing name still raises. The patch is removed before
the function returns; :data:`SKIPPED` lists what was skipped. See docs/bundles.md (PyTorch).
"""

from __future__ import annotations

import threading
from typing import Any

#: ``aten.<op>.<overload>`` names that torchax asked for and torch does not have.
SKIPPED: list[str] = []

_lock = threading.Lock()
_torchax: Any = None

#: Substrings of the overload names of named-tensor (``Dimname``) variants, lower-cased.
_NAMED_TENSOR = ("dimname", "names")


class RemovedOverload:
    """Stands in for an ATen overload the installed torch no longer has (never called)."""

    def __init__(self, qualified: str) -> None:
        self.qualified = qualified

    def __repr__(self) -> str:
        return f"<overload {self.qualified} (not in this torch)>"

    def __hash__(self) -> int:
        return hash(self.qualified)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemovedOverload) and other.qualified == self.qualified


def import_torchax() -> Any:
    """``torchax`` with its default environment built, on torch 2.13 too (thread-safe, once).

    Returns:
        The ``torchax`` module.

    Raises:
        ImportError: torchax or torch is not installed (``pip install 'hloserve[export-torch]'``).
    """
    global _torchax
    with _lock:
        if _torchax is not None:
            return _torchax
        import torch._ops

        packet = torch._ops.OpOverloadPacket
        original = packet.__getattr__

        def lenient(self: Any, key: str) -> Any:
            try:
                return original(self, key)
            except AttributeError:
                if key.startswith("__") or not any(s in key.lower() for s in _NAMED_TENSOR):
                    raise
                qualified = f"{self}.{key}"
                if qualified not in SKIPPED:
                    SKIPPED.append(qualified)
                return RemovedOverload(qualified)

        packet.__getattr__ = lenient  # type: ignore[method-assign]
        try:
            import torchax

            torchax.default_env()  # loads the lowerings and decompositions (more lookups)
        finally:
            packet.__getattr__ = original  # type: ignore[method-assign]
        _torchax = torchax
        return torchax
