"""The runtime's side of the channel (docs/serving.md, "Front -> runtime (the channel)", whose
Messages item lists the protocol). Counts go to ``publish`` every flush, never per execution (a
Triton metric call is a ~48 us synchronous stub -> server message)."""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import selectors
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hloserve.bundle.manifest import UNBATCHED
from hloserve.errors import HloserveError, InvalidArgumentError, Status, UnavailableError
from hloserve.triton_backend import channel
from hloserve.triton_backend.channel import batching
from hloserve.triton_backend.runtime.core import LoadedBundle, RuntimeModel, variant_label
from hloserve.triton_backend.runtime.device_memory import DeviceMemory
from hloserve.triton_backend.runtime.scheduler import (
    REASON_CANCELLED,
    Batch,
    Scheduler,
    SchedulerConfig,
    Work,
)
from hloserve.triton_backend.runtime.sequence_state import SequenceStates, gather, scatter

log = logging.getLogger("hloserve.triton_backend.runtime.server")

#: ``publish((model, variant label, batch size), executions since the last call)``.
Publish = Callable[[tuple[str, str, int], int], None]


@dataclass(frozen=True)
class RuntimeState:
    """What the runtime publishes every flush besides execution counts: per (model, variant)
    real and padding rows, sheds per (model, reason), scheduler snapshots by model, learned
    costs (s), device memory figures (None on CPU), bytes of live sequences' state."""

    rows: dict[tuple[str, str], tuple[int, int]]
    shed: dict[tuple[str, str], int]
    models: dict[str, Any]
    costs: dict[tuple[str, str, int], float]
    memory: dict[str, int] | None = None
    sequence_bytes: dict[str, int] = field(default_factory=dict)


@dataclass(eq=False)
class _Connection:
    sock: socket.socket
    lock: threading.Lock = field(default_factory=threading.Lock)
    pid: int = 0
    arena: channel.Segment | None = None
    loaded: LoadedBundle | None = None
    open: bool = True

    def send(self, message: dict[str, Any]) -> None:
        if not self.open:
            return
        try:
            with self.lock:
                channel.send(self.sock, message)
        except OSError:
            self.open = False


#: (name, shape, dtype, bytes) per tensor, in the manifest's order
_Layout = tuple[tuple[str, tuple[int, ...], np.dtype, int], ...]
#: most cached layouts (bundle, variant, rows) before the table starts again
_MAX_LAYOUTS = 4096


@dataclass
class _Job:
    conn: _Connection
    id: int
    rows: int
    inputs: list[np.ndarray]
    outputs: list[np.ndarray]
    segments: list[channel.Segment]
    #: a stateful model's ``[correlation ID, START, END]``, else None
    sequence: list[Any] | None = None
    #: its state rows on the device, one per ``state`` pair (``SequenceStates.rows``)
    state: list[Any] | None = None


def error_message(exc: BaseException) -> dict[str, Any]:
    """The ``status``/``message`` fields of a failure message for ``exc``."""
    if isinstance(exc, HloserveError):
        return {"status": exc.status.name, "message": exc.message}
    log.exception("runtime execution failed", exc_info=exc)
    return {"status": Status.INTERNAL.name, "message": f"{type(exc).__name__}: {exc}"}


class RuntimeServer:
    """Serves ``core`` to this tritonserver's front instances over the channel at ``address``;
    ``publish``/``publish_state`` get counts and a :class:`RuntimeState` every
    ``flush_interval_s``; ``memory`` re-sizes the weight budget for (or refuses) each bundle
    taken."""

    def __init__(
        self,
        core: RuntimeModel,
        *,
        address: str,
        scheduler_config: SchedulerConfig | None = None,
        publish: Publish | None = None,
        publish_state: Callable[[RuntimeState], None] | None = None,
        flush_interval_s: float = 1.0,
        key: str | None = None,
        memory: DeviceMemory | None = None,
    ) -> None:
        self.core = core
        self.memory = memory
        self.address = address
        self.key = key or channel.server_key()
        self.scheduler = Scheduler(scheduler_config or SchedulerConfig(), self._shed)
        self._publish = publish
        self._publish_state = publish_state
        self._rows: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
        self._shed_counts: dict[tuple[str, str], int] = defaultdict(int)
        self._flush_interval_s = flush_interval_s
        self._counts: dict[tuple[str, str, int], int] = defaultdict(int)
        self._counts_lock = threading.Lock()
        self._holds: dict[str, int] = {}
        self._loaded: dict[str, LoadedBundle] = {}
        self._holds_lock = threading.Lock()
        self._connections: set[_Connection] = set()
        #: connections whose hello is loading; executables finished by every hello so far
        self._loading: set[_Connection] = set()
        self._executables_done = 0
        self._layouts: dict[tuple[str, int, int], tuple[_Layout, _Layout]] = {}
        self.sequences = SequenceStates(place=core.place, memory=memory)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._listener: socket.socket | None = None
        self.executions = 0
        self.items = 0

    def start(self) -> None:
        """Remove dead servers' segments, listen (a reload's new runtime retries while the old
        one holds the address), start the threads."""
        removed = channel.remove_stale_segments(self.key)
        if removed:
            log.info("removed %d shared-memory files left by dead processes", len(removed))
        self._wake_r, self._wake_w = socket.socketpair()
        with contextlib.suppress(OSError):
            self._listener = channel.listen(self.address)
        for target, name in (
            (self._loop, "hloserve-runtime"),
            (self._flush_loop, "hloserve-metrics"),
        ):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def close(self) -> None:
        """Stop: close every connection (fronts see the runtime gone), release every hold."""
        self._stop.set()
        self.scheduler.close()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        for thread in self._threads:
            thread.join(timeout=5)
        for conn in list(self._connections):
            self._drop(conn)
        if self._listener is not None:
            self._listener.close()
        self._wake_r.close()
        self._wake_w.close()
        self._flush()

    def _loop(self) -> None:
        """Accept, read every ready connection, run one batch; again (no thread hop, see
        docs/serving.md, "Requests"); a ``hello`` loads on a thread of its own."""
        sel = selectors.DefaultSelector()
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        if self._listener is not None:  # bound by start()
            sel.register(self._listener, selectors.EVENT_READ, "listen")
        busy = False
        while not self._stop.is_set():
            if self._listener is None:
                self._try_listen(sel)
            timeout = 0.0 if busy else (0.5 if self._listener is not None else 0.05)
            for key, _ in sel.select(timeout):
                if key.data == "wake":
                    continue
                if key.data == "listen":
                    self._accept(sel)
                    continue
                conn = key.data
                try:
                    messages = channel.receive_ready(conn.sock)
                except channel.ChannelClosed:
                    sel.unregister(conn.sock)
                    self._drop(conn)
                    continue
                for message in messages:
                    try:
                        self._dispatch(conn, message)
                    except Exception:
                        log.exception("channel message failed")
            batch = self.scheduler.next(timeout=0)
            busy = batch is not None
            if batch is not None:
                self._run_batch(batch)
        sel.close()

    def _try_listen(self, sel: selectors.BaseSelector) -> None:
        try:
            self._listener = channel.listen(self.address)
        except OSError:
            return
        sel.register(self._listener, selectors.EVENT_READ, "listen")

    def _accept(self, sel: selectors.BaseSelector) -> None:
        assert self._listener is not None
        try:
            sock, _ = self._listener.accept()
        except OSError:
            return
        if channel.peer_uid(sock) != os.getuid():
            log.warning("refused a channel connection from another user")
            sock.close()
            return
        conn = _Connection(sock)
        self._connections.add(conn)
        sel.register(sock, selectors.EVENT_READ, conn)

    def _dispatch(self, conn: _Connection, message: dict[str, Any]) -> None:
        op = message.get("op")
        if op == "run":
            self._submit(conn, message["works"])
        elif op == "cancel":  # the front's clients gave up: shed what still waits
            ids = set(message["ids"])
            self.scheduler.cancel(
                lambda w: (
                    isinstance(w.payload, _Job) and w.payload.conn is conn and w.payload.id in ids
                )
            )
        elif op == "hello":
            threading.Thread(
                target=self._hello, args=(conn, message), name="hloserve-load", daemon=True
            ).start()
        else:
            log.warning("unknown channel message %r", op)

    def _hello(self, conn: _Connection, message: dict[str, Any]) -> None:
        def progress() -> None:
            with self._holds_lock:
                self._executables_done += 1
                done = self._executables_done
            conn.send({"op": "progress", "executables": done})

        with self._holds_lock:
            self._loading.add(conn)
        try:
            conn.pid = int(message["pid"])
            conn.arena = channel.Segment(str(message["arena"]))
            loaded = self.core.acquire(str(message["model"]), Path(message["bundle"]), progress)
        except Exception as exc:
            conn.send({"op": "error", **error_message(exc)})
            return
        finally:
            with self._holds_lock:
                self._loading.discard(conn)
        try:
            if self.memory is not None:  # re-size the weight budget, or refuse the bundle
                self.memory.admit(loaded.key, loaded.name, loaded.executables)
        except Exception as exc:
            self.core.release(loaded.key)
            conn.send({"op": "error", **error_message(exc)})
            return
        self._hold(loaded)
        conn.loaded = loaded
        conn.send({"op": "ready", "key": loaded.key})

    def _hold(self, loaded: LoadedBundle) -> None:
        manifest = loaded.bundle.manifest
        with self._holds_lock:
            self._holds[loaded.key] = self._holds.get(loaded.key, 0) + 1
            self._loaded[loaded.key] = loaded
            if self._holds[loaded.key] == 1:
                sizes = manifest.batching.compiled_batch_sizes or [1]
                for variant in range(len(manifest.variant_dims)):
                    self.scheduler.register(loaded.key, variant, sizes, coalesce=manifest.batched)

    def _drop(self, conn: _Connection) -> None:
        if conn not in self._connections:
            return
        conn.open = False
        self._connections.discard(conn)
        with contextlib.suppress(OSError):
            conn.sock.shutdown(socket.SHUT_RDWR)
        conn.sock.close()
        loaded, conn.loaded = conn.loaded, None
        if loaded is not None:
            with self._holds_lock:
                self._holds[loaded.key] -= 1
                last = self._holds[loaded.key] == 0
                if last:
                    del self._holds[loaded.key]
                    del self._loaded[loaded.key]
                    self.scheduler.unregister(loaded.key)
                    self.sequences.drop_bundle(loaded.key)
                    if self.memory is not None:
                        self.memory.forget(loaded.key)
            self.core.release(loaded.key)
        if conn.arena is not None:
            conn.arena.close()
        if conn.pid and not channel.process_alive(conn.pid):  # the front died: clean up
            channel.remove_segments_of(conn.pid, self.key)

    def _submit(self, conn: _Connection, works: Sequence[dict[str, Any]]) -> None:
        loaded = conn.loaded
        for w in works:
            try:
                if loaded is None:
                    raise UnavailableError("runtime: this front has not loaded its bundle")
                job = self._job(conn, loaded, w)
                deadline = w.get("deadline")
                self.scheduler.submit(
                    Work(
                        model=loaded.key,
                        variant=int(w["variant"]),
                        rows=job.rows,
                        payload=job,
                        deadline=float(deadline) if deadline is not None else None,
                        committed=bool(w.get("committed")),
                    )
                )
            except Exception as exc:
                if isinstance(exc, ValueError):
                    exc = InvalidArgumentError(f"runtime: {exc}")
                conn.send({"op": "failed", "ids": [w["id"]], **error_message(exc)})

    def _job(self, conn: _Connection, loaded: LoadedBundle, w: dict[str, Any]) -> _Job:
        variant = int(w["variant"])
        rows = int(w["rows"]) if loaded.bundle.manifest.batched else 1
        layout = self._layouts.get((loaded.key, variant, rows))
        if layout is None:
            layout = self._layout(loaded, variant, rows)
        segments: list[channel.Segment] = []

        def views(tensors: _Layout, places: Sequence[Sequence[Any]]) -> list[np.ndarray]:
            if len(places) != len(tensors):
                raise InvalidArgumentError(f"model {loaded.name!r}: wrong tensor count")
            out: list[np.ndarray] = []
            for (name, shape, dtype, nbytes), (segment_name, offset) in zip(
                tensors, places, strict=True
            ):
                if segment_name:
                    seg = channel.Segment(str(segment_name))
                    segments.append(seg)
                else:
                    assert conn.arena is not None
                    seg = conn.arena
                if offset < 0 or offset + nbytes > seg.size:
                    raise InvalidArgumentError(
                        f"model {loaded.name!r}: tensor {name!r} lies outside its segment"
                    )
                out.append(np.ndarray(shape, dtype, buffer=seg.buffer, offset=int(offset)))
            return out

        job = _Job(
            conn,
            int(w["id"]),
            rows,
            views(layout[0], w["in"]),
            views(layout[1], w["out"]),
            segments,
            w.get("seq"),
        )
        manifest = loaded.bundle.manifest
        if manifest.stateful:
            if job.sequence is None or rows != 1:
                _close_segments([job])
                raise InvalidArgumentError(
                    f"model {loaded.name!r}: a stateful model's work needs a sequence, one row"
                )
            # Triton sends one request of a sequence at a time: the previous one's state is stored
            try:
                job.state = self.sequences.rows(
                    loaded.key, manifest, job.sequence, functools.partial(_weight, loaded)
                )
            except Exception:
                _close_segments([job])
                raise
        return job

    def _layout(self, loaded: LoadedBundle, variant: int, rows: int) -> tuple[_Layout, _Layout]:
        """The inputs' and outputs' layouts at ``variant`` and ``rows``, cached."""
        manifest = loaded.bundle.manifest
        if not 0 <= variant < len(manifest.variant_dims):
            raise InvalidArgumentError(f"model {loaded.name!r}: no variant {variant}")
        dims = manifest.variant_dims[variant]

        def tensors(specs: Sequence[Any]) -> _Layout:
            out = []
            for spec in specs:
                shape = spec.shape_at(rows, dims)
                dtype = spec.dtype_info.numpy
                out.append((spec.name, shape, dtype, math.prod(shape) * dtype.itemsize))
            return tuple(out)

        layout = (tensors(manifest.inputs), tensors(manifest.outputs))
        if len(self._layouts) >= _MAX_LAYOUTS:
            self._layouts.clear()
        self._layouts[(loaded.key, variant, rows)] = layout
        return layout

    def _shed(self, work: Work, reason: str) -> None:
        job = work.payload
        assert isinstance(job, _Job)
        cancelled = reason == REASON_CANCELLED
        kind = "cancelled" if cancelled else "deadline"
        if "cannot be met" in reason or "stopping" in reason:
            kind = "laxity" if "cannot be met" in reason else "stopping"
        with self._counts_lock:
            self._shed_counts[(self._name_of(work.model), kind)] += 1
        status = Status.CANCELLED if cancelled else Status.UNAVAILABLE
        job.conn.send({"op": "failed", "ids": [job.id], "status": status.name, "message": reason})
        _close_segments([job])

    def _run_batch(self, batch: Batch) -> None:
        jobs = [w.payload for w in batch.works]
        assert all(isinstance(j, _Job) for j in jobs)
        try:
            self._execute(batch, jobs)  # type: ignore[arg-type]
            answer: dict[str, Any] = {"op": "done"}
        except Exception as exc:
            answer = {"op": "failed", **error_message(exc)}
        try:
            for conn, ids in _by_connection(jobs):  # type: ignore[arg-type]
                conn.send({**answer, "ids": ids})
        finally:
            _close_segments(jobs)  # type: ignore[arg-type]

    def _execute(self, batch: Batch, jobs: list[_Job]) -> None:
        with self._holds_lock:
            loaded = self._loaded.get(batch.model)
        if loaded is None:
            raise UnavailableError(f"runtime: model {batch.model!r} was unloaded")
        manifest = loaded.bundle.manifest
        size = batch.batch_size if manifest.batched else UNBATCHED
        state_in, state_out = _state_indices(manifest) if manifest.stateful else ({}, {})
        arrays: list[Any]
        if manifest.batched:
            arrays = [
                gather([j.state[state_in[i]] for j in jobs], size)  # type: ignore[index]
                if i in state_in
                else batching.concatenate([j.inputs[i] for j in jobs], spec.batch_axis or 0, size)
                for i, spec in enumerate(manifest.inputs)
            ]
        else:
            arrays = list(jobs[0].inputs)
        start = time.perf_counter()
        results = self.core.run(loaded, batch.variant, size, arrays)
        host = {i: np.asarray(r) for i, r in enumerate(results) if i not in state_out}
        self.scheduler.record(batch, time.perf_counter() - start)
        rows = [j.rows for j in jobs]
        for i, spec in enumerate(manifest.outputs):
            if i in state_out:  # stays on the device: clients do not receive it
                continue
            parts = (
                batching.split(host[i], spec.batch_axis or 0, rows)
                if manifest.batched
                else [host[i]]
            )
            for job, part in zip(jobs, parts, strict=True):
                job.outputs[i][...] = part
        if manifest.stateful:  # each sequence's new rows, split on the device
            split = [scatter(results[i], len(jobs)) for i in state_out]
            for n, job in enumerate(jobs):
                assert job.sequence is not None
                self.sequences.store(loaded.key, job.sequence, [s[n] for s in split])
        label = variant_label(manifest.variant_dims[batch.variant])
        with self._counts_lock:
            self._counts[(loaded.name, label, size)] += 1
            rows = self._rows[(loaded.name, label)]
            rows[0] += batch.items
            rows[1] += size - batch.items if manifest.batched else 0
            self.executions += 1
            self.items += batch.items

    def _flush_loop(self) -> None:
        while not self._stop.wait(self._flush_interval_s):
            self._flush()

    def _flush(self) -> None:
        self.sequences.expire()
        with self._holds_lock:
            loading, done = list(self._loading), self._executables_done
        for conn in loading:  # fronts waiting in line: the runtime is still compiling
            conn.send({"op": "progress", "executables": done})
        with self._counts_lock:
            counts, self._counts = self._counts, defaultdict(int)
            rows, self._rows = self._rows, defaultdict(lambda: [0, 0])
            shed, self._shed_counts = self._shed_counts, defaultdict(int)
        if self._publish is not None:
            for key, n in counts.items():
                try:
                    self._publish(key, n)
                except Exception:
                    log.exception("publishing execution counts failed")
        if self._publish_state is not None:
            try:
                self._publish_state(self._state(rows, shed))
            except Exception:
                log.exception("publishing the runtime's state failed")

    def _name_of(self, key: str) -> str:
        """A held bundle's model name (a reload's key is ``name#generation``)."""
        with self._holds_lock:
            loaded = self._loaded.get(key)
        return loaded.name if loaded is not None else key.partition("#")[0]

    def _state(
        self, rows: dict[tuple[str, str], list[int]], shed: dict[tuple[str, str], int]
    ) -> RuntimeState:
        snapshot = self.scheduler.snapshot()
        with self._holds_lock:
            loaded = dict(self._loaded)
        models: dict[str, Any] = {}
        costs: dict[tuple[str, str, int], float] = {}
        for key, snap in snapshot.models.items():  # by bundle key: one name per model
            bundle = loaded.get(key)
            name = bundle.name if bundle is not None else key.partition("#")[0]
            models[name] = snap
            for (variant, size), seconds in snap.costs.items():
                dims = bundle.bundle.manifest.variant_dims[variant] if bundle is not None else {}
                costs[(name, variant_label(dims), size)] = seconds
        held = {b.name: 0 for b in loaded.values() if b.bundle.manifest.stateful}
        held.update(self.sequences.nbytes())
        memory = self.memory.figures() if self.memory is not None else None
        rows_out = {k: (v[0], v[1]) for k, v in rows.items()}
        return RuntimeState(rows_out, dict(shed), models, costs, memory, held)


def _state_indices(manifest: Any) -> tuple[dict[int, int], dict[int, int]]:
    """Tensor index -> ``state`` pair index, of a stateful manifest's inputs and outputs."""
    inputs = {s.name: i for i, s in enumerate(manifest.inputs)}
    outputs = {s.name: i for i, s in enumerate(manifest.outputs)}
    return (
        {inputs[p.input]: n for n, p in enumerate(manifest.state)},
        {outputs[p.output]: n for n, p in enumerate(manifest.state)},
    )


def _weight(loaded: LoadedBundle, name: str) -> np.ndarray:
    """A held bundle's weight by name (a ``weight:NAME`` initial state)."""
    return loaded.bundle.load_weights()[loaded.bundle.manifest.weights.order.index(name)]


def _by_connection(jobs: Sequence[_Job]) -> list[tuple[_Connection, list[int]]]:
    grouped: dict[_Connection, list[int]] = {}
    for job in jobs:
        grouped.setdefault(job.conn, []).append(job.id)
    return list(grouped.items())


def _close_segments(jobs: Sequence[_Job]) -> None:
    for job in jobs:
        job.inputs.clear()
        job.outputs.clear()
        for seg in job.segments:
            seg.close()
        job.segments.clear()
