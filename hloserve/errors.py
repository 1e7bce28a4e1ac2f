"""The one error root of hloserve and its mapping to gRPC and HTTP status codes.

Every error hloserve raises on purpose derives from :class:`HloserveError` and carries a
:class:`Status`. Transports (the Triton backend, the gateway, the CLI) translate it with
:data:`GRPC_CODE` and :data:`HTTP_STATUS`; nothing else decides a status code.

The table follows Triton's conventions (KServe V2 "Errors" section and Triton's
``TRITONSERVER_Error_Code``): unknown model -> NOT_FOUND, not ready -> UNAVAILABLE, bad
tensor -> INVALID_ARGUMENT, unsupported -> UNIMPLEMENTED, anything else -> INTERNAL. The
statuses hloserve never decides itself (CANCELLED, UNKNOWN, ALREADY_EXISTS, ...) are there so
that a worker's answer relayed by the gateway (:class:`UpstreamError`) keeps its code; their HTTP
codes are the ones of ``google/rpc/code.proto``.

Every error class of the package is defined here, grouped by the layer that raises it, and is
imported from here.
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


#: (gRPC numeric code as in grpc.StatusCode, HTTP status as Triton's HTTP frontend answers) of
#: each :class:`Status`.
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


class FailedPreconditionError(HloserveError):
    """The system is not in a state the operation needs (the command would destroy something
    it does not own, a setting contradicts the workers' own)."""

    status = Status.FAILED_PRECONDITION


class DeadlineExceededError(HloserveError):
    """The request's time budget ran out.

    Triton 2.51 has no deadline error code for a backend to answer: clients of a worker see
    UNAVAILABLE (gRPC 14, HTTP 503) with this message, which starts "... deadline exceeded".
    """

    status = Status.DEADLINE_EXCEEDED


class UpstreamError(HloserveError):
    """A worker's error answer, relayed by the gateway with the worker's own status and text.

    Args:
        message: the worker's message (``grpc-message``), possibly prefixed by the gateway.
        code_name: the worker's gRPC status code name, e.g. ``"UNAVAILABLE"`` (an unknown
            name is INTERNAL).
    """

    def __init__(self, message: str, code_name: str) -> None:
        super().__init__(message, status=Status.__members__.get(code_name, Status.INTERNAL))


# -- bundle, export, model repository ----------------------------------------------------------


class ArtifactError(InvalidArgumentError):
    """An executable file cannot be read as StableHLO or has no usable ``main``."""


class ManifestError(InvalidArgumentError):
    """A manifest breaks a format rule.

    Attributes:
        problems: one line per problem, each naming the tensor or key and expected vs actual.
    """

    def __init__(self, path: str, problems: list[str], *, status: Status | None = None) -> None:
        self.path = path
        self.problems = problems
        super().__init__("\n".join(f"{path}: {p}" for p in problems), status=status)


class BundleError(InvalidArgumentError):
    """A bundle failed validation.

    Attributes:
        bundle: the bundle directory.
        problems: the errors found (warnings excluded), each a
            :class:`hloserve.bundle.validate.Problem`.
        name: the model's name (the directory's unless given).
    """

    def __init__(self, bundle: Path, problems: Sequence[Any], name: str | None = None) -> None:
        self.bundle = bundle
        self.problems = list(problems)
        self.name = name or bundle.name
        lines = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"bundle {self.name!r} ({bundle}) is invalid:\n{lines}")


class ModelPyImportError(Exception):
    """A bundle's ``model.py`` could not be imported; ``str()`` is the exception, one line per
    ``traceback.format_exception_only`` line (file and line included for a syntax error).

    Not an :class:`HloserveError`: the caller wraps it in the error of its own layer.
    """


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
    """Triton refused a BLS request because the server itself is not ready yet.

    Retrying cannot help while the calling model is still loading (server readiness waits for
    it): the caller should fail at once.
    """


class SchedulerClosedError(UnavailableError):
    """``Scheduler.submit`` after ``Scheduler.close`` (the runtime is stopping)."""


class ChannelClosed(ConnectionError):
    """The other end of a front-runtime channel went away.

    A ``ConnectionError`` rather than an :class:`HloserveError`: it is the transport's signal
    to its owner, which answers the requests it held with an error of its own.
    """


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
