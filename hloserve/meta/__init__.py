"""Meta models: a bundle's Python ``run(inputs, call)`` chaining other models.

The typed core behind the ``hloserve_meta`` Triton backend (docs/meta_models.md): loading
``run`` (:func:`load_run`), the ``call`` object (:class:`MetaCall`), the per-worker gate
(:class:`MetaGate`) and the client's deadline (:class:`Deadline`). Nothing here imports
Triton; the transport of ``call`` is injected.

Modules:
    core: load ``run``, check tensors, gate, call (:class:`MetaModel`, :class:`MetaCall`).
    channel_calls: sub-calls to bundle models over the runtime's channel, from the meta's
        own process.
    gate: the per-worker gate (at most N meta runs at once per server).
    deadline: the client's timeout, counted from when the run starts.
"""

from hloserve.errors import DeadlineExceededError
from hloserve.meta.core import Call, MetaCall, MetaModel, Run, Send, load_run
from hloserve.meta.deadline import Deadline
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
