"""Adapters between Triton Python backend objects and the typed core, without importing them.

The ``model.py`` shims pass ``triton_python_backend_utils`` (``pb_utils``) in as an argument;
this module never imports it, so everything here is unit-testable with stand-ins. It holds:

* :data:`TRITON_ERROR_CODE`: the one table from :class:`~hloserve.errors.Status` to the
  ``pb_utils.TritonError`` code a response carries (Triton maps those to gRPC/HTTP codes), and
  the way back from a Triton error (:func:`error_from_triton`; Triton's texts are read by
  :mod:`hloserve.triton_messages`);
* :func:`inference_response`: a response holding tensors or an error;
* :func:`configure_logging`: the ``hloserve`` loggers to the server's log.

The ``args`` of ``initialize`` are :class:`~hloserve.model_parameters.ModelArgs`.

Tensor conversion (DLPack, bfloat16 included) is :mod:`hloserve.triton_backend.backends.dlpack`.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Mapping
from typing import Any

from hloserve import triton_messages
from hloserve.errors import (
    HloserveError,
    ServerStartingError,
    Status,
)
from hloserve.triton_backend.backends.dlpack import to_triton_tensor

log = logging.getLogger("hloserve.triton_backend")

#: ``pb_utils.TritonError`` code (attribute name) for each Status. Triton 2.51's codes are
#: UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS,
#: CANCELLED; its gRPC frontend answers them as INTERNAL/UNKNOWN, NOT_FOUND, INVALID_ARGUMENT,
#: UNAVAILABLE, UNIMPLEMENTED, ALREADY_EXISTS, CANCELLED. Statuses Triton lacks map to the
#: nearest code a client treats the same way (retryable ones to UNAVAILABLE). The first Status
#: listed for a code is the one :func:`status_of_code` gives back.
TRITON_ERROR_CODE: dict[Status, str] = {
    Status.INVALID_ARGUMENT: "INVALID_ARG",
    Status.NOT_FOUND: "NOT_FOUND",
    Status.UNAVAILABLE: "UNAVAILABLE",
    Status.UNIMPLEMENTED: "UNSUPPORTED",
    Status.INTERNAL: "INTERNAL",
    Status.FAILED_PRECONDITION: "INVALID_ARG",
    Status.RESOURCE_EXHAUSTED: "UNAVAILABLE",
    Status.DEADLINE_EXCEEDED: "UNAVAILABLE",
    # Statuses only relayed from a worker by the gateway; a backend never raises them, and
    # status_of_code keeps reading those Triton codes as INTERNAL (as before they existed).
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
    """Message and ``pb_utils.TritonError`` code name for an exception raised by the core.

    An :class:`~hloserve.errors.HloserveError` keeps its message and status; anything else is a
    bug: INTERNAL, with its type in the message and the traceback logged.
    """
    if isinstance(error, HloserveError):
        return error.message, TRITON_ERROR_CODE[error.status]
    log.error(
        "internal error: %s",
        "".join(traceback.format_exception(type(error), error, error.__traceback__)),
    )
    return f"internal error: {type(error).__name__}: {error}", TRITON_ERROR_CODE[Status.INTERNAL]


def status_of_code(code_name: str, message: str = "") -> Status:
    """The Status of a Triton error code name (inverse of :data:`TRITON_ERROR_CODE`).

    A message saying a model "is not ready" is UNAVAILABLE whatever its code (Triton 2.51 gives
    that text for BLS to a model that is still loading). Unknown codes are INTERNAL.
    """
    if triton_messages.model_not_ready(message):
        return Status.UNAVAILABLE
    for status, name in TRITON_ERROR_CODE.items():
        if name == code_name:
            return status
    return Status.INTERNAL


def error_from_triton(pb_utils: Any, error: Any) -> HloserveError:
    """An :class:`HloserveError` from a ``pb_utils.TritonError`` (e.g. a BLS response's).

    The status comes from the message's not-ready texts, else from the error code (Triton 2.51
    hands a BLS caller every callee error as INTERNAL, measured; a meta's sub-calls to bundles
    go over the channel instead, with their status).
    """
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


# -- initialize(args) --------------------------------------------------------------------------


_logging_configured = False


def configure_logging(level: int = logging.INFO) -> None:
    """Send the ``hloserve`` loggers' records to stderr (the server's log), once per process.

    A stub's stdout and stderr go to tritonserver's output; without a handler only warnings
    would reach it (Python's last-resort handler).
    """
    global _logging_configured
    if _logging_configured:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("hloserve %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("hloserve")
    root.addHandler(handler)
    root.setLevel(level)
    _logging_configured = True


__all__ = [
    "TRITON_ERROR_CODE",
    "configure_logging",
    "error_code",
    "error_from_triton",
    "inference_response",
    "status_of_code",
    "triton_error",
]
