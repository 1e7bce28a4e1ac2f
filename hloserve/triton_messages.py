"""Triton's error texts that hloserve must recognise, and predicates over them.

Triton's status code does not always say what went wrong (BLS answers INTERNAL whatever the
callee said; no deadline code), so hloserve reads the text, only through these predicates. Texts
measured on tritonserver 2.51 (tests/test_triton_messages.py). Dependency-free.
"""

from __future__ import annotations

#: A model that is not (yet) loaded, or absent over BLS: "... Model 'x' is not ready."
MODEL_NOT_READY = "is not ready"

#: Any inference, BLS included, refused while the server itself is starting.
SERVER_NOT_READY = "Server not ready"

#: A model the server does not know: "Request for unknown model: 'x' is not found" (lower-cased).
UNKNOWN_MODEL = ("unknown model", "is not found")

#: A request whose ``timeout`` ran out while it waited in a queue (lower-cased).
TIMEOUT_EXPIRED = "timeout expired"

#: A restricted API called without its key: "This API is restricted, expecting header '<h>'".
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
