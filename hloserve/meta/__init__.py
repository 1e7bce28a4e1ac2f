"""Meta models: a bundle's Python ``run(inputs, call)`` chaining other models (docs/meta_models.md).

The typed core behind the ``hloserve_meta`` Triton backend; nothing here imports Triton.
Modules: core (load ``run``, :class:`MetaModel`, :class:`MetaCall`), channel_calls (sub-calls
over the runtime's channel), gate (at most N meta runs per server), deadline.
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
