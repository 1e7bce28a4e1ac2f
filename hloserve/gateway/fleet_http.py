"""KServe HTTP calls that need every worker, answered by the gateway's control plane.

HAProxy sends the paths of :data:`CONDITIONS` and :data:`MODEL_CONTROL_PATH` to
:class:`FleetHttpServer`; :class:`FleetHttp` calls every worker by :mod:`~.fleet_ops`' rules.
Workers' answers are relayed as written; the gateway's own errors are ``{"error": "..."}``
(docs/gateway.md, "KServe HTTP").
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import math
import re
import sys
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeAlias

from hloserve.errors import (
    HTTP_STATUS,
    HloserveError,
    InvalidArgumentError,
    Status,
    UnavailableError,
)
from hloserve.gateway import fleet_ops
from hloserve.gateway.aggregate import merge_repository_index, merge_statistics_json
from hloserve.gateway.auth import CERT_HEADER, ControlAuth
from hloserve.gateway.model_control import Action, ModelControl
from hloserve.model_control import HEADER

log = logging.getLogger("hloserve.gateway")

#: The KServe HTTP paths this module answers.
INDEX_PATH = "/v2/repository/index"
SHM_PREFIX = "/v2/systemsharedmemory"
CUDA_SHM_PREFIX = "/v2/cudasharedmemory"
#: HAProxy ``path_reg`` of the model-control paths.
MODEL_CONTROL_PATH = r"^/v2/repository/models/[^/]+/(load|unload)$"
#: HAProxy ``path_reg`` of the statistics paths.
STATS_PATH = r"^/v2/models(/[^/]+(/versions/[^/]+)?)?/stats$"

#: HAProxy conditions of the paths answered here (model control has its own backend).
CONDITIONS = (
    f"{{ path {INDEX_PATH} }} || {{ path_beg {SHM_PREFIX} }} || {{ path_beg {CUDA_SHM_PREFIX} }}",
    f"{{ path_end /stats }} {{ path_reg {STATS_PATH} }}",
)

_SHM = r"(/v2/(?:system|cuda)sharedmemory)"
_REGISTER = re.compile(_SHM + r"/region/([^/]+)/register")
_UNREGISTER = re.compile(_SHM + r"(?:/region/[^/]+)?/unregister")
_MODEL_CONTROL = re.compile(r"/v2/repository/models/([^/]+)/(load|unload)")
_STATS = re.compile(STATS_PATH.strip("^$"))

#: How long a model load or unload may take, seconds (HAProxy waits as long).
MODEL_CONTROL_TIMEOUT_S = 3600

#: Largest request body taken, bytes (over ``dataplane.HTTP_MAX_JSON_BYTES``).
MAX_BODY_BYTES = 4 << 20

#: An inference path: the model's name and version.
_INFER = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer")
#: Seconds a kept-alive connection to the checked frontend may idle (HAProxy's: 3600 s).
KEEP_ALIVE_S = 60.0

#: How a kept-alive connection the server had closed fails on the next request.
_CLOSED_UNANSWERED = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)

#: The gateway's own credentials, not passed on to the workers.
_CREDENTIALS = frozenset({"authorization", CERT_HEADER})

#: A worker's reply headers relayed with its answer (binary outputs of a JSON request).
_RELAYED = ("Inference-Header-Content-Length",)

#: Request headers not passed on (hop-by-hop, the HTTP client's, ``Accept-Encoding``).
_NOT_FORWARDED = frozenset(
    [
        "accept-encoding",
        "connection",
        "content-length",
        "expect",
        "host",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ]
)


@dataclass(frozen=True)
class Answer:
    """One HTTP answer: a worker's, relayed (``headers``: :data:`_RELAYED`), or the gateway's."""

    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def ok(self) -> bool:
        """Whether the status is 2xx."""
        return 200 <= self.status < 300

    @classmethod
    def error(cls, exc: HloserveError, headers: tuple[tuple[str, str], ...] = ()) -> Answer:
        """``{"error": message}`` with the HTTP code of the error's status."""
        body = json.dumps({"error": exc.message}, separators=(",", ":"), ensure_ascii=False)
        return cls(HTTP_STATUS[exc.status], body.encode(), headers=headers)


#: A worker's answer, or why it gave none (the connection failed or broke).
Reply: TypeAlias = Answer | str
#: A request to the workers: method, path (with its query), body, headers.
_Request: TypeAlias = tuple[str, str, bytes, Mapping[str, str]]


class _HttpJudge:
    def ok(self, reply: Reply) -> bool:
        return isinstance(reply, Answer) and reply.ok

    def unavailable(self, reply: Reply) -> bool:
        """No answer (a connection error's text) or a 503."""
        return not isinstance(reply, Answer) or reply.status == HTTP_STATUS[Status.UNAVAILABLE]

    def reason(self, text: str) -> Reply:
        return text

    def failed(self, what: str, replies: fleet_ops.Replies[Reply]) -> Answer:
        """The first worker's Triton error; 503 naming every worker when none answered."""
        for _, reply in replies:
            if isinstance(reply, Answer):
                return reply
        reasons = "; ".join(f"worker {w}: {reply}" for w, reply in replies) or "no worker"
        return Answer.error(UnavailableError(f"{what}: no worker answered ({reasons})"))


_JUDGE = _HttpJudge()


def _json(reply: Reply) -> Any:
    try:
        return json.loads(reply.body) if isinstance(reply, Answer) else None
    except ValueError:
        return None


def _answer(reply: Reply) -> Answer:
    return reply if isinstance(reply, Answer) else Answer.error(UnavailableError(reply))


def _json_answer(value: Any) -> Answer:
    return Answer(200, json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def _index(reply: Reply) -> list[dict[str, Any]]:
    rows = _json(reply)
    if isinstance(rows, list) and all(isinstance(r, dict) for r in rows):
        return rows
    raise ValueError("its repository index is not a JSON list of objects")


def _merged(indexes: list[list[dict[str, Any]]]) -> Reply:
    key = lambda row: (str(row.get("name", "")), str(row.get("version", "")))  # noqa: E731
    return _json_answer(merge_repository_index(indexes, key, lambda row: str(row.get("state"))))


def _stats(reply: Reply) -> dict[str, Any]:
    stats = _json(reply)
    rows = stats.get("model_stats") if isinstance(stats, dict) else None
    if isinstance(rows, list) and all(isinstance(r, dict) for r in rows):
        return stats
    raise ValueError("its statistics are not a JSON object with a model_stats list")


def _load_parameters(body: bytes) -> list[str]:
    """The parameter names of a model-load body; [] when it has none or is not JSON."""
    try:
        parameters = json.loads(body).get("parameters") if body else None
    except (ValueError, AttributeError, RecursionError):
        return []
    return [str(k) for k in parameters] if isinstance(parameters, dict) else []


def _connection(address: str, timeout_s: float) -> http.client.HTTPConnection:
    host, _, port = address.rpartition(":")
    return http.client.HTTPConnection(host.strip("[]"), int(port), timeout=timeout_s)


def _exchange(
    connection: http.client.HTTPConnection,
    method: str,
    path: str,
    body: bytes,
    headers: Mapping[str, str],
) -> Answer:
    """One request on ``connection``; raises OSError or HTTPException when it fails or breaks."""
    connection.request(method, path, body=body or None, headers=dict(headers))
    reply = connection.getresponse()
    kind = reply.getheader("Content-Type") or "application/json"
    relayed = tuple((h, v) for h in _RELAYED if (v := reply.getheader(h)) is not None)
    return Answer(reply.status, reply.read(), kind, relayed)


def _leaves(data: Any) -> int:
    """How many non-list leaves a JSON ``data`` value holds, at any nesting."""
    count, pending = 0, [data]
    while pending:
        item = pending.pop()
        if isinstance(item, list):
            pending.extend(item)
        else:
            count += 1
    return count


def json_data_mismatch(model: str, body: bytes) -> str | None:
    """Why a JSON inference request for ``model`` cannot be parsed, or None.

    Only what tritonserver 2.51 trips on: an input whose ``data`` element count differs from the
    product of its ``shape``; the message is Triton's text, the model, the input and both counts.
    """
    try:
        request = json.loads(body)
    except (ValueError, RecursionError):
        return None
    inputs = request.get("inputs") if isinstance(request, dict) else None
    for tensor in inputs if isinstance(inputs, list) else ():
        if not isinstance(tensor, dict) or "data" not in tensor:
            continue
        shape = tensor.get("shape")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            continue
        if (declared := math.prod(shape)) != (held := _leaves(tensor["data"])):
            return (
                "Unable to parse 'data': Shape does not match true shape of 'data' field: "
                f"model '{model}', input '{tensor.get('name')}': shape {shape} declares "
                f"{declared} elements, 'data' holds {held}"
            )
    return None


class FleetHttp:
    """The fleet's answers to the KServe HTTP calls of the module docstring (no server).

    ``workers`` are Triton HTTP endpoints in ``grpc_workers``' order; ``control`` runs on
    ``loop`` (None: the first worker answers); ``checked``: HAProxy's ``http_checked`` frontend.

    Raises:
        ValueError: ``control`` without ``loop`` or with ``grpc_workers`` of another length.
    """

    def __init__(
        self,
        workers: Sequence[str],
        request_timeout_s: float,
        probe_timeout_s: float,
        repository_headers: Mapping[str, str] | None = None,
        control: ModelControl | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        grpc_workers: Sequence[str] = (),
        checked: str | None = None,
        auth: ControlAuth | None = None,
    ) -> None:
        if control is not None and (loop is None or len(grpc_workers) != len(workers)):
            raise ValueError("FleetHttp: control needs the loop and every worker's gRPC endpoint")
        self._control = control
        self._loop = loop
        self._http_of = dict(zip(grpc_workers, workers, strict=False))
        self.checked = checked
        self._local = threading.local()
        self.workers = tuple(workers)
        self._timeout = request_timeout_s
        self._probe_timeout = probe_timeout_s
        self._repository_headers = dict(repository_headers or {})
        self._auth = auth
        self._pool = ThreadPoolExecutor(
            max_workers=max(4, 2 * len(self.workers)), thread_name_prefix="hloserve-fleet-http"
        )

    def set_workers(self, workers: Sequence[str], grpc_workers: Sequence[str]) -> None:
        """Make ``workers`` (``grpc_workers``' order) the fleet; calls started keep theirs."""
        self._http_of = dict(zip(grpc_workers, workers, strict=True))
        self.workers = tuple(workers)

    def close(self) -> None:
        """Stop the threads that call the workers."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def answer(self, method: str, path: str, body: bytes, headers: Mapping[str, str]) -> Answer:
        """The answer to one client request (``path`` with its query string)."""
        route = path.split("?", 1)[0]
        passed = {k: v for k, v in headers.items() if k.lower() not in _NOT_FORWARDED}
        request = (method, path, body, passed)
        if route == INDEX_PATH:  # asked with the workers' model-control key
            keyed = {k: v for k, v in passed.items() if k.lower() != HEADER}
            index = (method, path, body, keyed | self._repository_headers)
            what = "repository index"
            return self._run(fleet_ops.merged(_JUDGE, what, index, _index, _merged, probe=True))
        if (checked := self.checked) is not None and (match := _INFER.fullmatch(route)):
            # JSON inference: 500 when json_data_mismatch refuses it, else the checked frontend's
            model = urllib.parse.unquote(match.group(1))
            if method == "POST" and (problem := json_data_mismatch(model, body)) is not None:
                log.warning("gateway: %s refused before any worker: %s", path, problem)
                return Answer.error(HloserveError(problem, status=Status.INTERNAL))
            reply = self._call_checked(checked, request)
            if isinstance(reply, str):
                why = f"model '{model}': the gateway's routing frontend: {reply}"
                return Answer.error(UnavailableError(why))
            return reply
        if match := _REGISTER.fullmatch(route):
            prefix, region = match.groups()
            undo = ("POST", f"{prefix}/region/{region}/unregister", b"", passed)
            what = f"{prefix[4:]} register {region!r}"
            return self._run(fleet_ops.register(_JUDGE, what, request, undo))
        if _UNREGISTER.fullmatch(route):
            return self._run(fleet_ops.unregister(_JUDGE, route, request))
        if _STATS.fullmatch(route) and method == "GET":
            summed = lambda r: _json_answer(merge_statistics_json(r))  # noqa: E731
            return self._run(fleet_ops.merged(_JUDGE, "statistics", request, _stats, summed))
        if (match := _MODEL_CONTROL.fullmatch(route)) and method == "POST" and self._control:
            model = urllib.parse.unquote(match.group(1))
            action: Action = "load" if match.group(2) == "load" else "unload"
            if self._auth is not None:
                try:
                    self._auth.check({k.lower(): v for k, v in headers.items()}, True)
                except HloserveError as exc:
                    return Answer.error(exc, (("WWW-Authenticate", "Bearer"),))
                sent = {k.lower(): v for k, v in passed.items()}
                passed = {
                    **{k: v for k, v in passed.items() if k.lower() not in _CREDENTIALS},
                    **({} if HEADER in sent else self._repository_headers),
                }
            return self.model_control(action, model, path, body, passed)
        # the first worker's answer; no connection or a 503 moves on to the next
        return self._run(fleet_ops.first_answer(_JUDGE, f"{method} {path}", request, self.workers))

    def _call(self, worker: str, request: _Request, timeout_s: float) -> Reply:
        connection = _connection(worker, timeout_s)
        try:
            return _exchange(connection, *request)
        except (OSError, http.client.HTTPException) as exc:
            return f"{type(exc).__name__}: {exc}"
        finally:
            connection.close()

    def _call_checked(self, checked: str, request: _Request) -> Reply:
        """One exchange on this thread's kept-alive connection to ``checked``; a reused one that
        ends unanswered (HAProxy closes idle ones on reload) is retried once on a new one.
        """
        local = self._local
        connection: http.client.HTTPConnection | None = getattr(local, "connection", None)
        if connection is not None and time.monotonic() - local.used > KEEP_ALIVE_S:
            connection.close()
            connection = None
        reused = connection is not None
        while True:
            if connection is None:
                connection = local.connection = _connection(checked, self._timeout)
            try:
                answer = _exchange(connection, *request)
            except (OSError, http.client.HTTPException) as exc:
                connection.close()
                connection = local.connection = None
                if reused and isinstance(exc, _CLOSED_UNANSWERED):
                    reused = False
                    continue
                return f"{type(exc).__name__}: {exc}"
            if connection.sock is None:  # http.client closed it: ``Connection: close``
                local.connection = None
            local.used = time.monotonic()
            return answer

    def _fan_out(self, step: fleet_ops.Send[_Request]) -> fleet_ops.Replies[Reply]:
        targets = self.workers if step.workers is None else tuple(step.workers)
        timeout_s = self._probe_timeout if step.probe else self._timeout
        replies = self._pool.map(lambda w: self._call(w, step.request, timeout_s), targets)
        return list(zip(targets, replies, strict=True))

    def _run(self, plan: fleet_ops.Plan[_Request, Reply]) -> Answer:
        return _answer(fleet_ops.drive(plan, self._fan_out))

    def model_control(
        self, action: Action, model: str, path: str, body: bytes, headers: Mapping[str, str]
    ) -> Answer:
        """``POST /v2/repository/models/{model}/load|unload`` where :class:`ModelControl` decides:
        the first refusal, else the first worker's success.
        """
        control, loop = self._control, self._loop
        assert control is not None and loop is not None  # answer() checked
        parameters = _load_parameters(body) if action == "load" else []

        def send(how: Action, name: str, workers: Sequence[str]) -> fleet_ops.Replies[Reply]:
            own = how == action and name == model
            where = path if own else f"/v2/repository/models/{urllib.parse.quote(name)}/{how}"
            targets = [self._http_of[w] for w in workers]
            sent = body if own else b""
            replies = self._fan_out(fleet_ops.Send(("POST", where, sent, headers), targets))
            return [(w, r) for w, (_, r) in zip(workers, replies, strict=True)]

        def step(
            how: Action, name: str, workers: Sequence[str]
        ) -> Awaitable[fleet_ops.Replies[Reply]]:
            return asyncio.to_thread(send, how, name, workers)

        run = control.run(action, model, step, _JUDGE.ok, parameters)
        future = asyncio.run_coroutine_threadsafe(run, loop)
        try:
            outcome = future.result(MODEL_CONTROL_TIMEOUT_S)
        except HloserveError as exc:  # refused before any worker (ModelControl.run)
            return Answer.error(exc)
        except TimeoutError:
            future.cancel()
            what = f"model {action} {model!r}: not done within {MODEL_CONTROL_TIMEOUT_S} s"
            return Answer.error(UnavailableError(f"gateway: {what}"))
        replies = [(self._http_of[w], r) for w, r in outcome.answers]
        return _answer(fleet_ops.decided(_JUDGE, f"model {action} {model!r}", replies))

    def end_thread(self) -> None:
        """Close this thread's connection to the checked frontend."""
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A kept-alive connection closed or reset is logged at debug, not printed."""
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError | TimeoutError):
            log.debug("gateway: fleet HTTP: %s: %s", client_address, error)
        else:
            log.exception("gateway: fleet HTTP: connection from %s failed", client_address)


class FleetHttpServer:
    """:class:`FleetHttp` on a loopback HTTP port (port 0: a free one, see :attr:`address`).

    Raises:
        OSError: the address cannot be bound.
    """

    def __init__(self, fleet: FleetHttp, host: str = "127.0.0.1", port: int = 0) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: HAProxy reuses its connection
            disable_nagle_algorithm = True  # headers and body written apart: no 40 ms wait

            def _handle(self) -> None:
                try:
                    headers = dict(self.headers.items())
                    reply = fleet.answer(self.command, self.path, self._body(), headers)
                except InvalidArgumentError as exc:  # the body was not read: close after
                    self.close_connection = True
                    reply = Answer.error(exc)
                except HloserveError as exc:
                    reply = Answer.error(exc)
                except Exception as exc:  # answered, logged, and the server keeps serving
                    log.exception("gateway: %s %s failed", self.command, self.path)
                    reply = Answer.error(HloserveError(f"gateway: internal error: {exc}"))
                self.send_response(reply.status)
                self.send_header("Content-Type", reply.content_type)
                self.send_header("Content-Length", str(len(reply.body)))
                for name, value in reply.headers:
                    self.send_header(name, value)
                if self.close_connection:
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(reply.body)

            def _body(self) -> bytes:
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    raise InvalidArgumentError(
                        f"gateway: {self.path}: send the body with a Content-Length"
                    )
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                except ValueError:
                    length = -1
                if not 0 <= length <= MAX_BODY_BYTES:
                    raise InvalidArgumentError(
                        f"gateway: {self.path}: Content-Length must be 0 to {MAX_BODY_BYTES}"
                        f" bytes, got {self.headers.get('Content-Length')}"
                    )
                return self.rfile.read(length) if length else b""

            do_GET = do_POST = do_PUT = do_DELETE = _handle

            def finish(self) -> None:
                try:
                    super().finish()
                finally:
                    fleet.end_thread()

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("gateway: fleet HTTP: " + format, *args)

        self.fleet = fleet
        self._server = _Server((host, port), Handler)
        self.address = f"{host}:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="hloserve-gateway-fleet-http", daemon=True
        )

    def start(self) -> None:
        """Serve on a daemon thread."""
        self._thread.start()

    def close(self) -> None:
        """Stop serving, release the port and the worker-call threads (idempotent)."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()
        self.fleet.close()
