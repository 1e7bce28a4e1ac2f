"""Every hloserve error class, and the mapping of their :class:`Status` to gRPC and HTTP codes.

Each deliberate error derives from :class:`HloserveError`; transports translate its status with
:data:`GRPC_CODE` and :data:`HTTP_STATUS` following Triton's ``TRITONSERVER_Error_Code`` and
KServe V2 "Errors"; statuses hloserve never decides itself are kept for relayed worker answers
(:class:`UpstreamError`), with ``google/rpc/code.proto``'s HTTP codes.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from pathlib import Path
from typing import Any


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
    # Only relayed from a worker (UpstreamError); hloserve does not raise them itself.
    CANCELLED = "CANCELLED"
    UNKNOWN = "UNKNOWN"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    ABORTED = "ABORTED"
    OUT_OF_RANGE = "OUT_OF_RANGE"
    DATA_LOSS = "DATA_LOSS"
    UNAUTHENTICATED = "UNAUTHENTICATED"


#: (gRPC numeric code, HTTP status) of each :class:`Status`.
_CODES: dict[Status, tuple[int, int]] = {
    Status.INVALID_ARGUMENT: (3, 400),
    Status.NOT_FOUND: (5, 404),
    Status.UNAVAILABLE: (14, 503),
    Status.UNIMPLEMENTED: (12, 501),
    Status.FAILED_PRECONDITION: (9, 400),
    Status.RESOURCE_EXHAUSTED: (8, 429),
    Status.DEADLINE_EXCEEDED: (4, 504),
    Status.INTERNAL: (13, 500),
    Status.CANCELLED: (1, 499),
    Status.UNKNOWN: (2, 500),
    Status.ALREADY_EXISTS: (6, 409),
    Status.PERMISSION_DENIED: (7, 403),
    Status.ABORTED: (10, 409),
    Status.OUT_OF_RANGE: (11, 400),
    Status.DATA_LOSS: (15, 500),
    Status.UNAUTHENTICATED: (16, 401),
}
#: gRPC numeric status code of each :class:`Status` (grpc.StatusCode values).
GRPC_CODE: dict[Status, int] = {status: grpc for status, (grpc, _) in _CODES.items()}
#: HTTP status code of each :class:`Status`, as Triton's HTTP frontend answers.
HTTP_STATUS: dict[Status, int] = {status: http for status, (_, http) in _CODES.items()}


class HloserveError(Exception):
    """Root of every deliberate hloserve error; ``status`` maps to a gRPC/HTTP code."""

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


class FailedPreconditionError(HloserveError):
    """The system is not in a state the operation needs."""

    status = Status.FAILED_PRECONDITION


class DeadlineExceededError(HloserveError):
    """The request's time budget ran out (a worker's clients see UNAVAILABLE: Triton 2.51
    backends cannot answer DEADLINE_EXCEEDED)."""

    status = Status.DEADLINE_EXCEEDED


class UpstreamError(HloserveError):
    """A worker's error answer relayed by the gateway; ``code_name`` is its gRPC status code
    name (unknown = INTERNAL)."""

    def __init__(self, message: str, code_name: str) -> None:
        super().__init__(message, status=Status.__members__.get(code_name, Status.INTERNAL))


# -- bundle, export, model repository ----------------------------------------------------------


class ArtifactError(InvalidArgumentError):
    """An executable file cannot be read as StableHLO or has no usable ``main``."""


class ManifestError(InvalidArgumentError):
    """A manifest breaks a format rule; ``problems``: one line each."""

    def __init__(self, path: str, problems: list[str], *, status: Status | None = None) -> None:
        self.path = path
        self.problems = problems
        super().__init__("\n".join(f"{path}: {p}" for p in problems), status=status)


class BundleError(InvalidArgumentError):
    """A bundle failed validation; ``problems`` are its errors
    (:class:`hloserve.bundle.validate.Problem`), ``name`` defaults to the directory's."""

    def __init__(self, bundle: Path, problems: Sequence[Any], name: str | None = None) -> None:
        self.bundle = bundle
        self.problems = list(problems)
        self.name = name or bundle.name
        lines = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"bundle {self.name!r} ({bundle}) is invalid:\n{lines}")


class ModelPyImportError(Exception):
    """A bundle's ``model.py`` could not be imported (``str()``: the exception's lines); not
    an :class:`HloserveError`: callers wrap it."""


class ExportError(InvalidArgumentError):
    """The function, params or specs cannot be exported as declared."""


class BatchSizeError(InvalidArgumentError):
    """``--batch-sizes`` cannot be applied as given."""


class RepositoryError(InvalidArgumentError):
    """The repository cannot be built as asked (name collision, target exists, no bundles)."""


class ForeignModelError(InvalidArgumentError):
    """A folder that is neither a bundle nor a Triton model hloserve can carry over."""


# -- Triton backend ----------------------------------------------------------------------------


class ServerStartingError(UnavailableError):
    """Triton refused a BLS request because the server is not ready yet (fail at once: it
    waits for the calling model)."""


class SchedulerClosedError(UnavailableError):
    """``Scheduler.submit`` after ``Scheduler.close`` (the runtime is stopping)."""


class ChannelClosed(ConnectionError):
    """The other end of a front-runtime channel went away (the owner answers with its own
    error)."""


# -- gateway -----------------------------------------------------------------------------------


class GatewayConfigError(InvalidArgumentError):
    """The gateway configuration is invalid; the message lists every problem with its key path."""


class WorkerSchedulingError(HloserveError):
    """An ``lpt_packing`` gateway's worker schedules ``fair``."""

    status = Status.FAILED_PRECONDITION


# -- node --------------------------------------------------------------------------------------


class TritonServerError(HloserveError):
    """The local tritonserver could not be found, started, made ready, or stopped."""


class PortInUseError(TritonServerError):
    """A port the server was asked to bind is already taken on that address."""

    status = Status.UNAVAILABLE


class PerfAnalyzerError(HloserveError):
    """perf_analyzer is missing or exited with an error."""


class NodeError(HloserveError):
    """The node cannot start, run or stop; the message says what to do."""

    status = Status.FAILED_PRECONDITION


class GpuNotFoundError(NodeError):
    """The node file asks for GPUs that this machine does not have."""


class NodeConfigError(InvalidArgumentError):
    """The node configuration is invalid; the message lists every problem with its key path."""


class AdminPortError(HloserveError):
    """The supervisor's admin port, given explicitly, cannot be bound."""

    status = Status.UNAVAILABLE
