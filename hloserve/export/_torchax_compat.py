"""Import ``torchax`` 0.0.13 on torch 2.13, which removed the named-tensor operator overloads.

While torchax imports and builds its default environment, a lookup of a missing *named-tensor*
(``Dimname``) overload returns an inert placeholder; any other missing name still raises, and
the patch is removed afterwards; :data:`SKIPPED` lists what was skipped (docs/bundles.md,
"The route, and why").
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

#: ``aten.<op>.<overload>`` names that torchax asked for and torch does not have.
SKIPPED: list[str] = []

_lock = threading.Lock()
_torchax: Any = None

#: Substrings of the overload names of named-tensor (``Dimname``) variants, lower-cased.
_NAMED_TENSOR = ("dimname", "names")


@dataclass(frozen=True)
class RemovedOverload:
    """Stands in for an ATen overload the installed torch no longer has (never called)."""

    qualified: str


def import_torchax() -> Any:
    """The ``torchax`` module with its default environment built, on torch 2.13 too (once); raises
    ImportError: torchax or torch is not installed (``pip install 'hloserve[export-torch]'``)."""
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

            torchax.default_env()  # more lookups
        finally:
            packet.__getattr__ = original  # type: ignore[method-assign]
        _torchax = torchax
        return torchax
