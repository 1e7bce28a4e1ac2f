"""Adapters between Triton Python backend objects and the typed core (``pb_utils`` passed in):
the Status <-> ``TritonError`` code table, responses, logging to the server's log."""

from __future__ import annotations

import functools
import logging
import traceback
from collections.abc import Mapping
from typing import Any

from hloserve import triton_messages
from hloserve.errors import HloserveError, ServerStartingError, Status
from hloserve.triton_backend.backends.dlpack import to_triton_tensor

log = logging.getLogger("hloserve.triton_backend")

#: ``pb_utils.TritonError`` code name per Status (Triton 2.51 has 8 codes; missing statuses map
#: to the nearest code a client treats alike); the first Status of a code is the way back
TRITON_ERROR_CODE: dict[Status, str] = {
    Status.INVALID_ARGUMENT: "INVALID_ARG",
    Status.NOT_FOUND: "NOT_FOUND",
    Status.UNAVAILABLE: "UNAVAILABLE",
    Status.UNIMPLEMENTED: "UNSUPPORTED",
    Status.INTERNAL: "INTERNAL",
    Status.FAILED_PRECONDITION: "INVALID_ARG",
    Status.RESOURCE_EXHAUSTED: "UNAVAILABLE",
    Status.DEADLINE_EXCEEDED: "UNAVAILABLE",
    # only relayed from a worker by the gateway; a backend never raises them
    Status.CANCELLED: "INTERNAL",
    Status.UNKNOWN: "INTERNAL",
    Status.ALREADY_EXISTS: "INTERNAL",
    Status.PERMISSION_DENIED: "INTERNAL",
    Status.ABORTED: "INTERNAL",
    Status.OUT_OF_RANGE: "INVALID_ARG",
    Status.DATA_LOSS: "INTERNAL",
    Status.UNAUTHENTICATED: "INTERNAL",
}


def error_code(error: BaseException) -> tuple[str, str]:
    """Message and ``pb_utils.TritonError`` code name for an exception: an HloserveError's own,
    else INTERNAL with its type (traceback logged)."""
    if isinstance(error, HloserveError):
        return error.message, TRITON_ERROR_CODE[error.status]
    log.error(
        "internal error: %s",
        "".join(traceback.format_exception(type(error), error, error.__traceback__)),
    )
    return f"internal error: {type(error).__name__}: {error}", TRITON_ERROR_CODE[Status.INTERNAL]


def status_of_code(code_name: str, message: str = "") -> Status:
    """The Status of a Triton error code name (unknown: INTERNAL); a "not ready" message is
    UNAVAILABLE whatever its code (BLS to a model still loading)."""
    if triton_messages.model_not_ready(message):
        return Status.UNAVAILABLE
    return next((s for s, name in TRITON_ERROR_CODE.items() if name == code_name), Status.INTERNAL)


def error_from_triton(pb_utils: Any, error: Any) -> HloserveError:
    """An :class:`HloserveError` from a ``pb_utils.TritonError`` (a BLS response's): status from
    the not-ready texts, else the code (Triton 2.51 hands BLS callers every error INTERNAL)."""
    message = str(error.message())
    if triton_messages.server_not_ready(message):
        return ServerStartingError(message)
    code = error.code()
    name = next(
        (n for n in set(TRITON_ERROR_CODE.values()) if getattr(pb_utils.TritonError, n) == code),
        "INTERNAL",
    )
    return HloserveError(message, status=status_of_code(name, message))


def triton_error(pb_utils: Any, error: BaseException) -> Any:
    """A ``pb_utils.TritonError`` for an exception (see :func:`error_code`)."""
    message, code = error_code(error)
    return pb_utils.TritonError(message, getattr(pb_utils.TritonError, code))


def inference_response(pb_utils: Any, result: Mapping[str, Any] | BaseException) -> Any:
    """A ``pb_utils.InferenceResponse`` holding ``result``'s tensors, or its error."""
    if isinstance(result, BaseException):
        return pb_utils.InferenceResponse(error=triton_error(pb_utils, result))
    try:
        tensors = [to_triton_tensor(pb_utils, n, a) for n, a in result.items()]
    except Exception as exc:
        return pb_utils.InferenceResponse(error=triton_error(pb_utils, exc))
    return pb_utils.InferenceResponse(output_tensors=tensors)


@functools.cache
def configure_logging(level: int = logging.INFO) -> None:
    """Send the ``hloserve`` loggers' records to stderr (the server's log), once per process."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("hloserve %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("hloserve")
    root.addHandler(handler)
    root.setLevel(level)
