"""Triton's error texts that hloserve must recognise, in one place.

Triton does not always carry what went wrong in its status code: a BLS response reaches the
caller as INTERNAL whatever the callee answered, a model that is still loading and one that is
absent answer with the same words, and there is no deadline code for a backend. Where hloserve's
behaviour depends on what Triton meant, it reads the message text, and only through the
predicates of this module; each text was measured on tritonserver 2.51 (the examples below are
verbatim) and tests/test_triton_messages.py holds them. Dependency-free: every layer may import it.
"""

from __future__ import annotations

#: A model that is not (yet) loaded, e.g. over BLS "Failed for execute the inference request.
#: Model 'hloserve_runtime' is not ready." (also what BLS says for a model absent from the
#: server).
MODEL_NOT_READY = "is not ready"

#: Any inference, BLS included, refused while the server itself is starting (core
#: ``InferenceServer::InferAsync``; BLS: "Model X - Error when running inference: Server not
#: ready"). Models load before the server is ready.
SERVER_NOT_READY = "Server not ready"

#: A model the server does not know: "Request for unknown model: 'x' is not found" (lower-cased
#: texts; matched case-insensitively).
UNKNOWN_MODEL = ("unknown model", "is not found")

#: A request whose ``timeout`` ran out while it waited in a queue (lower-cased).
TIMEOUT_EXPIRED = "timeout expired"

#: A restricted API called without its key: "This API is restricted, expecting header
#: '<header>'".
API_RESTRICTED = "restricted"


def model_not_ready(message: str) -> bool:
    """Whether ``message`` says a model is not ready (loading, unloaded, or absent over BLS)."""
    return MODEL_NOT_READY in message


def server_not_ready(message: str) -> bool:
    """Whether ``message`` is Triton's refusal of an inference while the server starts."""
    return SERVER_NOT_READY in message


def unknown_model(message: str) -> bool:
    """Whether ``message`` says the server does not know the model (case-insensitive)."""
    lowered = message.lower()
    return any(text in lowered for text in UNKNOWN_MODEL)


def timeout_expired(message: str) -> bool:
    """Whether ``message`` says a request's ``timeout`` ran out in a queue (case-insensitive)."""
    return TIMEOUT_EXPIRED in message.lower()


def api_restricted(message: str) -> bool:
    """Whether ``message`` is Triton's refusal of a restricted API called without its key."""
    return API_RESTRICTED in message


__all__ = [
    "API_RESTRICTED",
    "MODEL_NOT_READY",
    "SERVER_NOT_READY",
    "TIMEOUT_EXPIRED",
    "UNKNOWN_MODEL",
    "api_restricted",
    "model_not_ready",
    "server_not_ready",
    "timeout_expired",
    "unknown_model",
]
