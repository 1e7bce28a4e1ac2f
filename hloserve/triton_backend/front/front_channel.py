"""A front instance's side of the channel (docs/serving.md, "Front -> runtime (the channel)").

:class:`ChannelFront` sends each request as one work (inputs in the instance's shared-memory
arena, room for its outputs) and answers it through ``respond``: inline in
:meth:`~ChannelFront.run`, or from a reader thread after :meth:`~ChannelFront.submit`. No JAX."""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hloserve import names
from hloserve.errors import HloserveError, InvalidArgumentError, Status, UnavailableError
from hloserve.triton_backend import channel
from hloserve.triton_backend.front.core import FrontModel, Prepared, SequenceId
from hloserve.triton_backend.front.hooks import IdentityHooks

log = logging.getLogger("hloserve.triton_backend.front.front_channel")

#: numbers of this process's shared-memory files, shared by every front of the process
_SEGMENT_NUMBERS = itertools.count(1)
#: seconds between two looks at ``is_cancelled()`` of the requests ``run()`` waits for
CANCEL_POLL_S = 0.05
#: seconds into a batch's preparation after which a request is asked ``is_cancelled()`` before
#: it is sent: Triton's dynamic batcher already drops a request cancelled in its queue (core
#: r24.10, ``PolicyQueue::ApplyPolicy``), and each call is a round trip to tritonserver (~75 us
#: measured on 2.51), so only a request whose batch spent this long in the front (preprocess
#: hooks) is asked (docs/serving.md, "Queue bounds and deadlines")
CANCEL_CHECK_AFTER_S = 0.005
#: seconds a starting front waits for its runtime's stub to appear (then it loads in the
#: background: Triton's load threads may all be taken by fronts)
RUNTIME_GRACE_S = 2.0
#: ``respond(handle, result)``: answer one request (outputs by name, or its error)
Respond = Callable[[Any, "Mapping[str, np.ndarray] | Exception"], None]


@dataclass
class _Pending:
    handle: Any
    prepared: Prepared
    outputs: list[np.ndarray]
    offset: int = -1
    nbytes: int = 0
    overflow: channel.Segment | None = None
    #: the link it was sent over; None until sent (a lost link fails only its own works)
    link: channel.Link | None = None
    cancelled: Callable[[], bool] | None = None


@dataclass
class Request:
    """One request: ``handle`` goes back to ``respond``; ``inputs`` by name or the exception it
    failed with; ``deadline`` in ``time.monotonic()`` seconds; ``cancelled`` asked just before
    it is sent once its batch spent :data:`CANCEL_CHECK_AFTER_S` in the front, then while it
    waits; ``sequence_id`` 0 = none."""

    handle: Any
    inputs: Mapping[str, np.ndarray] | Exception
    deadline: float | None = None
    cancelled: Callable[[], bool] | None = None
    sequence_id: SequenceId = 0


class ChannelFront:
    """Serves one front instance's requests through the runtime's channel at ``address``:
    ``respond`` answers one request; ``wait_s``: how long a request waits for an absent runtime;
    ``inline``: answers read by :meth:`run`'s caller; ``committed``: a meta's sub-calls."""

    def __init__(
        self,
        core: FrontModel,
        bundle: Path,
        respond: Respond,
        *,
        address: str,
        wait_s: float = 120.0,
        arena_bytes: int = channel.DEFAULT_ARENA_BYTES,
        max_request_bytes: int = 1 << 30,
        key: str | None = None,
        inline: bool = False,
        committed: bool = False,
    ) -> None:
        self.core = core
        self.inline = inline
        self.committed = committed
        self.bundle = Path(bundle)
        self.address = address
        self.wait_s = wait_s
        self.max_request_bytes = max_request_bytes
        self._respond = respond
        self._key = key or channel.server_key()
        self._pid = os.getpid()
        self.arena = channel.Arena(self._new_segment(arena_bytes))
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count()
        self._link: channel.Link | None = None
        self._ready = threading.Event()
        self._load_error: HloserveError | None = None
        #: the runtime's latest executables-finished count, and when it grew (monotonic s)
        self._progress = -1
        self._progress_at = 0.0
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self._keep_inputs = not isinstance(core.hooks, IdentityHooks)

    def start(self, wait_s: float = 0.0) -> None:
        """Connect and load the bundle; with ``wait_s`` > 0 return once the runtime accepted it
        (docs/serving.md, "Front -> runtime (the channel)", Loading; no runtime stub within
        :data:`RUNTIME_GRACE_S`: warn and load in the background). Raises the runtime's error for a
        bundle that failed to load, or UNAVAILABLE: no listening or no progress for ``wait_s``."""
        listening = wait_s > 0 and self._wait_listening(wait_s)
        self._thread = threading.Thread(target=self._run, name="hloserve-front", daemon=True)
        self._thread.start()
        if listening and not self._wait_ready(wait_s):
            error = self._load_error or UnavailableError(
                f"model {self.core.name!r}: the runtime made no compile progress for "
                f"{wait_s:g} s while loading the bundle ({names.PARAM_RUNTIME_WAIT_S})"
            )
            self.close()
            raise error

    def _wait_listening(self, seconds: float) -> bool:
        """Whether the runtime listens, waiting up to ``seconds`` once its stub runs; False when
        no stub ran within the grace. UnavailableError: a stub ran, nothing listened."""
        begun = time.monotonic()
        grace = min(RUNTIME_GRACE_S, seconds)
        seen = False
        delay = 0.02
        while True:
            try:
                channel.connect(self.address, timeout=5).close()
                return True
            except OSError:
                pass
            seen = seen or channel.runtime_stub_running(self.core.runtime_model)
            waited = time.monotonic() - begun
            if not seen and waited >= grace:
                log.warning(
                    "model %r: no runtime (%r) started within %g s; loading the bundle in the "
                    "background, so this model may report READY before it is compiled (load "
                    "the runtime model first, as hloserve serve and node up do)",
                    self.core.name,
                    self.core.runtime_model,
                    grace,
                )
                return False
            if waited >= seconds:
                self.close()
                raise UnavailableError(
                    f"model {self.core.name!r}: the runtime ({self.core.runtime_model!r}) "
                    f"was not listening after {seconds:g} s ({names.PARAM_RUNTIME_WAIT_S})"
                )
            time.sleep(min(delay, max(seconds - waited, 0.001)))
            delay = min(delay * 2, 0.25)

    def _wait_ready(self, seconds: float) -> bool:
        """Wait until loaded; False once refused, or ``seconds`` after the later of now and the
        runtime's latest compile progress."""
        start = time.monotonic()
        while not self._ready.is_set():
            if self._load_error is not None or self._closed.is_set():
                return False
            remaining = max(start, self._progress_at) + seconds - time.monotonic()
            if remaining <= 0:
                return False
            self._ready.wait(min(remaining, 0.05))
        return True

    def _run(self) -> None:
        delay = 0.02
        while not self._closed.is_set():
            try:
                sock = channel.connect(self.address, timeout=5)
            except OSError:
                self._closed.wait(delay)
                delay = min(delay * 2, 0.25)
                continue
            delay = 0.02
            link = channel.Link(sock)
            try:
                self._hello(link)
                if self.inline and self._link is link:
                    # run() reads the answers; this thread only watches for a hang-up
                    channel.wait_hangup(link)
                    continue
                while True:
                    self._handle(channel.receive(link.sock))
            except channel.ChannelClosed:
                pass
            except Exception:
                log.exception("model %r: channel to the runtime failed", self.core.name)
            finally:
                self._lost(link)

    def _hello(self, link: channel.Link) -> None:
        if not self.arena.segment.path.exists():  # removed under us: nothing is in flight now
            self.arena.segment.close()
            self.arena = channel.Arena(self._new_segment(self.arena.segment.size))
        channel.send(
            link.sock,
            {
                "op": "hello",
                "pid": self._pid,
                "arena": self.arena.segment.name,
                "model": self.core.name,
                "bundle": str(self.bundle),
            },
        )
        answer = channel.receive(link.sock)
        while answer.get("op") == "progress":  # compiling: the wait's deadline moves on
            if int(answer.get("executables", 0)) > self._progress:
                self._progress = int(answer.get("executables", 0))
                self._progress_at = time.monotonic()
            answer = channel.receive(link.sock)
        if answer.get("op") != "ready":
            # requests get this error; the idle connection stays so a new runtime is asked again
            self._load_error = HloserveError(
                str(answer.get("message", answer)),
                status=Status[answer.get("status", "INTERNAL")],
            )
            log.error("%s", self._load_error.message)
            return
        self._load_error = None
        with self._lock:
            self._link = link
        self._ready.set()

    def _lost(self, link: channel.Link) -> None:
        """Fail what is in flight on ``link``, once (a second caller waits for the first)."""
        with self._lock:
            first = not link.closed.is_set()
            link.closed.set()
        if not first:
            link.failed.wait()
            return
        try:
            self._fail_in_flight(link)
        finally:
            link.failed.set()

    def _fail_in_flight(self, link: channel.Link) -> None:
        self._ready.clear()
        with self._lock:
            if self._link is link:
                self._link = None
            # only what went over this link: a work placed but not sent waits for the next
            lost = [k for k, p in self._pending.items() if p.link is link]
            pending = {k: self._pending.pop(k) for k in lost}
        with contextlib.suppress(OSError):
            link.sock.shutdown(socket.SHUT_RDWR)  # wakes a run() blocked reading it
        with contextlib.suppress(OSError):
            link.sock.close()
        if pending:
            log.warning(
                "model %r: the runtime went away; %d requests in flight fail UNAVAILABLE",
                self.core.name,
                len(pending),
            )
        error = UnavailableError(
            f"model {self.core.name!r}: the runtime went away while the request was in flight; "
            "retry"
        )
        for p in pending.values():
            self._release(p)
            self._answer(p.handle, error)

    def close(self) -> None:
        """Disconnect (the runtime releases the bundle), fail what is in flight, drop the arena."""
        self._closed.set()
        with self._lock:
            link = self._link
        if link is not None:
            with contextlib.suppress(OSError):
                link.sock.shutdown(socket.SHUT_RDWR)
            self._lost(link)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.arena.segment.unlink()
        self.arena.segment.close()

    def submit(self, requests: Sequence[Request]) -> None:
        """Send each request as one work; answers come through ``respond`` (a request's own
        problem at once)."""
        assert not self.inline, "an inline front reads its answers in run()"
        self._submit(requests)

    def run(self, requests: Sequence[Request]) -> None:
        """Send each request as one work and answer them all before returning, reading the
        answers on this thread (``inline=True``); a lost runtime fails them UNAVAILABLE."""
        assert self.inline, "run() needs inline=True (a reader thread would race it)"
        sent = self._submit(requests)
        if sent is None:
            return
        link, ids = sent
        left = set(ids)
        with self._lock:
            probes = {i: p.cancelled for i in ids if (p := self._pending.get(i)) and p.cancelled}
        try:
            while left:
                if probes and not select.select([link.sock], [], [], CANCEL_POLL_S)[0]:
                    self._cancel(link, probes, left)
                    continue
                for work_id in self._handle(channel.receive(link.sock)):
                    left.discard(work_id)
        except channel.ChannelClosed:
            self._lost(link)

    def _cancel(
        self, link: channel.Link, probes: dict[int, Callable[[], bool]], left: set[int]
    ) -> None:
        """Tell the runtime which of ``left`` their clients gave up on (each once)."""
        gone = [i for i in left if i in probes and probes[i]()]
        for work_id in gone:
            del probes[work_id]
        if gone:
            with self._send_lock, contextlib.suppress(OSError):  # a lost link fails them anyway
                channel.send(link.sock, {"op": "cancel", "ids": gone})

    def _submit(self, requests: Sequence[Request]) -> tuple[channel.Link, list[int]] | None:
        works: list[dict[str, Any]] = []
        ids: list[int] = []
        check_after = time.monotonic() + CANCEL_CHECK_AFTER_S
        for request in requests:
            try:
                if isinstance(request.inputs, Exception):
                    raise request.inputs
                self._check_size(request.inputs)
                prepared = self.core.prepare(request.inputs, sequence_id=request.sequence_id)
                if self._keep_inputs:  # postprocess sees them after the request's memory
                    prepared.inputs = {
                        k: np.array(v, copy=True) for k, v in prepared.inputs.items()
                    }
                if (
                    request.cancelled is not None
                    and time.monotonic() >= check_after
                    and request.cancelled()
                ):
                    raise HloserveError(
                        f"model {self.core.name!r}: the request was cancelled before it was "
                        "sent to the runtime",
                        status=Status.CANCELLED,
                    )
                work, work_id = self._place(request, prepared)
            except Exception as exc:
                self._answer(request.handle, exc)
                continue
            works.append(work)
            ids.append(work_id)
        if works:
            # grouped by variant, groups in order of their first request: the scheduler
            # coalesces a model's leading run of one variant
            order = {v: i for i, v in reversed(list(enumerate(w["variant"] for w in works)))}
            pairs = sorted(zip(works, ids, strict=True), key=lambda p: order[p[0]["variant"]])
            link = self._send_works([w for w, _ in pairs], [i for _, i in pairs])
            if link is not None:
                return link, ids
        return None

    def _check_size(self, inputs: Mapping[str, np.ndarray]) -> None:
        nbytes = sum(int(a.nbytes) for a in inputs.values())
        if nbytes > self.max_request_bytes:
            raise InvalidArgumentError(
                f"model {self.core.name!r}: the request's inputs take {nbytes} bytes, more than "
                f"the limit of {self.max_request_bytes} bytes (--max-request-bytes)"
            )

    def _place(self, request: Request, prepared: Prepared) -> tuple[dict[str, Any], int]:
        arrays = self.core.runtime_inputs(prepared)
        out_specs = self.core.manifest.outputs
        out_shapes = self.core.output_shapes(prepared)
        out_sizes = [
            math.prod(shape) * spec.dtype_info.numpy.itemsize
            for spec, shape in zip(out_specs, out_shapes, strict=True)
        ]
        sizes = [channel.aligned(n) for n in [*(a.nbytes for a in arrays), *out_sizes]]
        total = sum(sizes)
        pending = _Pending(request.handle, prepared, [], nbytes=total, cancelled=request.cancelled)
        base = self.arena.allocate(total)
        if base is None:
            name = channel.segment_name(self._pid, next(_SEGMENT_NUMBERS), self._key)
            pending.overflow = channel.Segment(name, total, create=True)
            segment, segment_name, base = pending.overflow, name, 0
        else:
            segment, segment_name = self.arena.segment, ""
            pending.offset = base
        places: list[list[Any]] = []
        offset = base
        for array, size in zip(arrays, sizes, strict=False):
            np.ndarray(array.shape, array.dtype, buffer=segment.buffer, offset=offset)[...] = array
            places.append([segment_name, offset])
            offset += size
        out_places: list[list[Any]] = []
        for spec, shape, size in zip(out_specs, out_shapes, sizes[len(arrays) :], strict=True):
            pending.outputs.append(
                np.ndarray(shape, spec.dtype_info.numpy, buffer=segment.buffer, offset=offset)
            )
            out_places.append([segment_name, offset])
            offset += size
        work_id = next(self._ids)
        with self._lock:
            self._pending[work_id] = pending
        work: dict[str, Any] = {
            "id": work_id,
            "variant": prepared.variant,
            "rows": prepared.batch_size or 1,
            "deadline": request.deadline,
            "in": places,
            "out": out_places,
        }
        if prepared.sequence is not None:
            work["seq"] = list(prepared.sequence)
        if self.committed:
            work["committed"] = True
        return work, work_id

    def _send_works(self, works: list[dict[str, Any]], ids: list[int]) -> channel.Link | None:
        """Send ``works`` (waiting up to ``wait_s`` for a link); the link, or None when they
        failed (answered). Works not sent before a link was lost go to the next link."""
        deadline = time.monotonic() + self.wait_s
        error: HloserveError | None = None
        while True:
            if not self._wait_ready(deadline - time.monotonic()):
                error = self._load_error or UnavailableError(
                    f"model {self.core.name!r}: runtime not reachable after {self.wait_s:g} s"
                )
                break
            with self._lock:
                link = self._link
                if link is None:  # lost since the wait returned: wait for the next link
                    continue
                for work_id in ids:
                    p = self._pending.get(work_id)
                    if p is not None:
                        p.link = link
            try:
                with self._send_lock:
                    channel.send(link.sock, {"op": "run", "works": works})
                return link
            except OSError:  # not sent (a datagram goes whole or not at all)
                with self._lock:
                    unsent = [i for i in ids if i in self._pending]
                    for work_id in unsent:
                        self._pending[work_id].link = None
                self._lost(link)  # the link is dead: fail what did go over it, then wait
                if not unsent:  # the lost link's sweep answered them meanwhile
                    return None
                keep = set(unsent)
                works = [w for w in works if w["id"] in keep]
                ids = unsent
        for work_id in ids:
            with self._lock:
                p = self._pending.pop(work_id, None)
            if p is not None:
                self._release(p)
                self._answer(p.handle, error)
        return None

    def _handle(self, message: Mapping[str, Any]) -> list[int]:
        """Answer the works one runtime message names; their ids."""
        op = message.get("op")
        ids: list[int] = list(message.get("ids", ()))
        if op == "done":
            for work_id in ids:
                self._finish(work_id, None)
        elif op == "failed":
            error = HloserveError(
                str(message.get("message", "")),
                status=Status[message.get("status", "INTERNAL")],
            )
            for work_id in ids:
                self._finish(work_id, error)
        return ids

    def _finish(self, work_id: int, error: HloserveError | None) -> None:
        with self._lock:
            p = self._pending.pop(work_id, None)
        if p is None:
            return
        if error is not None:
            self._release(p)
            self._answer(p.handle, error)
            return
        outputs = [o.copy() for o in p.outputs]
        self._release(p)
        try:
            result: Mapping[str, np.ndarray] | Exception = self.core.finish(p.prepared, outputs)
        except Exception as exc:
            result = exc
        self._answer(p.handle, result)

    def _release(self, p: _Pending) -> None:
        p.outputs.clear()
        if p.overflow is not None:
            p.overflow.unlink()
            p.overflow.close()
        elif p.offset >= 0:
            self.arena.free(p.offset, p.nbytes)

    def _answer(self, handle: Any, result: Mapping[str, np.ndarray] | Exception) -> None:
        try:
            self._respond(handle, result)
        except Exception:
            log.exception("model %r: answering a request failed", self.core.name)

    def _new_segment(self, size: int) -> channel.Segment:
        name = channel.segment_name(self._pid, next(_SEGMENT_NUMBERS), self._key)
        try:
            return channel.Segment(name, size, create=True)
        except FileExistsError:  # left by an earlier process with this pid
            (channel.SHM_DIR / name).unlink(missing_ok=True)
            return channel.Segment(name, size, create=True)

    @property
    def in_flight(self) -> int:
        """Requests sent and not answered yet."""
        with self._lock:
            return len(self._pending)
