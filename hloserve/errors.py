"""The one error root of hloserve and its mapping to gRPC and HTTP status codes.

Every error hloserve raises on purpose derives from :class:`HloserveError` and carries a
:class:`Status`. Transports (the Triton backend, the gateway, the CLI) translate it with
:data:`GRPC_CODE` and :data:`HTTP_STATUS`; nothing else decides a status code.

The table follows Triton's conventions (KServe V2 "Errors" section and Triton's
``TRITONSERVER_Error_Code``): unknown model -> NOT_FOUND, not ready -> UNAVAILABLE, bad
tensor -> INVALID_ARGUMENT, unsupported -> UNIMPLEMENTED, anything else -> INTERNAL.
"""

from __future__ import annotations

import enum


class Status(enum.Enum):
    """Canonical status of an error; the names are gRPC's status code names."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    UNAVAILABLE = "UNAVAILABLE"
    UNIMPLEMENTED = "UNIMPLEMENTED"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    INTERNAL = "INTERNAL"


#: gRPC numeric status code of each :class:`Status` (grpc.StatusCode values).
GRPC_CODE: dict[Status, int] = {
    Status.INVALID_ARGUMENT: 3,
    Status.NOT_FOUND: 5,
    Status.UNAVAILABLE: 14,
    Status.UNIMPLEMENTED: 12,
    Status.FAILED_PRECONDITION: 9,
    Status.RESOURCE_EXHAUSTED: 8,
    Status.DEADLINE_EXCEEDED: 4,
    Status.INTERNAL: 13,
}

#: HTTP status code of each :class:`Status`, as Triton's HTTP frontend answers.
HTTP_STATUS: dict[Status, int] = {
    Status.INVALID_ARGUMENT: 400,
    Status.NOT_FOUND: 404,
    Status.UNAVAILABLE: 503,
    Status.UNIMPLEMENTED: 501,
    Status.FAILED_PRECONDITION: 400,
    Status.RESOURCE_EXHAUSTED: 429,
    Status.DEADLINE_EXCEEDED: 504,
    Status.INTERNAL: 500,
}


class HloserveError(Exception):
    """Root of every deliberate hloserve error.

    Attributes:
        status: the canonical status that transports map to a gRPC/HTTP code.
    """

    status: Status = Status.INTERNAL

    def __init__(self, message: str, *, status: Status | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status

    @property
    def message(self) -> str:
        """The error text, without the status."""
        return str(self.args[0]) if self.args else ""


class InvalidArgumentError(HloserveError):
    """A request or a file does not match what was declared (bad tensor, bad manifest)."""

    status = Status.INVALID_ARGUMENT


class NotFoundError(HloserveError):
    """A named model, tensor, or file does not exist."""

    status = Status.NOT_FOUND


class UnavailableError(HloserveError):
    """The target exists but is not ready yet; retrying may succeed."""

    status = Status.UNAVAILABLE


class UnimplementedError(HloserveError):
    """The request asks for something hloserve does not support."""

    status = Status.UNIMPLEMENTED
