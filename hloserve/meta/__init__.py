"""Meta models: a bundle's Python ``run(inputs, call)`` chaining other models.

The typed core behind the ``hloserve_meta`` Triton backend (docs/meta_models.md): loading
``run`` (:func:`load_run`), the ``call`` object (:class:`MetaCall`), the per-worker gate
(:class:`MetaGate`) and the client's deadline (:class:`Deadline`). Nothing here imports
Triton; the transport of ``call`` is injected.
"""

from hloserve.meta.core import Call, MetaCall, MetaModel, Run, Send, load_run
from hloserve.meta.deadline import Deadline, DeadlineExceededError
from hloserve.meta.gate import MetaGate, server_gate_dir

__all__ = [
    "Call",
    "Deadline",
    "DeadlineExceededError",
    "MetaCall",
    "MetaGate",
    "MetaModel",
    "Run",
    "Send",
    "load_run",
    "server_gate_dir",
]
