"""The channel in process: shared memory, the runtime server and front instances over a real
Unix socket (no Triton): loading by reference count, coalescing across fronts, errors, faults."""

from __future__ import annotations

import os
import shutil
import stat
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hloserve.bundle.bundle import load_bundle
from hloserve.errors import HloserveError, Status
from hloserve.triton_backend import channel
from hloserve.triton_backend.front.core import FrontModel
from hloserve.triton_backend.front.front_channel import ChannelFront, Request
from hloserve.triton_backend.runtime.core import RuntimeModel
from hloserve.triton_backend.runtime.scheduler import SchedulerConfig
from hloserve.triton_backend.runtime.server import RuntimeServer
from tests.conftest import GOLDEN

pytestmark = pytest.mark.usefixtures("restore_x64")

EXPECTED = dict(np.load(GOLDEN / "affine.expected.npz"))


class Answers:
    """Collects ``respond`` calls; ``wait(n)`` blocks until n answers arrived."""

    def __init__(self) -> None:
        self.results: dict[Any, Any] = {}
        self._cond = threading.Condition()

    def __call__(self, handle: Any, result: Any) -> None:
        with self._cond:
            self.results[handle] = result
            self._cond.notify_all()

    def wait(self, n: int, timeout: float = 30.0) -> dict[Any, Any]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.results) >= n, timeout), self.results
            return dict(self.results)


@pytest.fixture
def key() -> str:
    """A server key of this namespace no real server has (pid field = this process)."""
    ns = os.stat("/proc/self/ns/pid").st_ino
    return f"{os.getpid()}-{ns}"


@pytest.fixture
def server(key: str) -> Iterator[RuntimeServer]:
    addr = f"\0hloserve.channel-test-{uuid.uuid4().hex}"
    srv = RuntimeServer(
        RuntimeModel(),
        address=addr,
        scheduler_config=SchedulerConfig(discipline="fifo"),
        key=key,
        flush_interval_s=0.05,
    )
    srv.start()
    yield srv
    srv.close()


def front(
    server: RuntimeServer,
    key: str,
    answers: Answers,
    bundle: Path = GOLDEN / "affine",
    name: str = "affine",
    **kwargs: Any,
) -> ChannelFront:
    core = FrontModel(name, load_bundle(bundle))
    f = ChannelFront(core, bundle, answers, address=server.address, key=key, wait_s=20.0, **kwargs)
    f.start(wait_s=60.0)
    return f


def _runtime_at(addr: str, key: str) -> RuntimeServer:
    """A started runtime of the test's own at ``addr`` (the test stops it, starts another)."""
    srv = RuntimeServer(RuntimeModel(), address=addr, key=key)
    srv.start()
    return srv


def _affine_front(addr: str, key: str, respond: Any, **kwargs: Any) -> ChannelFront:
    """A started front of the golden affine bundle at ``addr``, waiting up to 30 s for it."""
    core = FrontModel("affine", load_bundle(GOLDEN / "affine"))
    f = ChannelFront(core, GOLDEN / "affine", respond, address=addr, key=key, wait_s=30.0, **kwargs)
    f.start(wait_s=60.0)
    return f


def test_segments_are_private_and_named_after_their_owner(key: str) -> None:
    name = channel.segment_name(os.getpid(), 99, key)
    seg = channel.Segment(name, 4096, create=True)
    try:
        assert stat.S_IMODE(os.stat(seg.path).st_mode) == 0o600
        parsed = channel.SegmentName.parse(name)
        assert parsed is not None and parsed.owner_pid == os.getpid()
    finally:
        seg.unlink()
        seg.close()


def test_arena_allocates_first_fit_and_merges_freed_runs() -> None:
    seg = channel.Segment(channel.segment_name(os.getpid(), 98), 1024, create=True)
    try:
        arena = channel.Arena(seg)
        a, b, c = (arena.allocate(100) for _ in range(3))
        assert (a, b, c) == (0, 128, 256)
        assert arena.allocate(1024) is None
        arena.free(128, 100)
        arena.free(0, 100)
        assert arena.allocate(256) == 0  # the two freed runs merged
        arena.free(0, 256)
        arena.free(256, 100)
        assert arena.free_bytes == 1024
    finally:
        seg.unlink()
        seg.close()


def test_stale_segments_are_removed_only_when_their_owner_is_gone(key: str) -> None:
    ns = key.split("-")[1]
    dead = channel.SHM_DIR / f"hloserve.channel-999999999-{ns}-999999998-1"  # no such server pid
    alive = channel.SHM_DIR / f"hloserve.channel-{os.getpid()}-{ns}-{os.getpid()}-77"
    other_ns = channel.SHM_DIR / "hloserve.channel-999999999-1-999999998-1"  # another container
    for path in (dead, alive, other_ns):
        path.write_bytes(b"x")
    try:
        removed = channel.remove_stale_segments(key)
        assert dead.name in removed and not dead.exists()
        assert alive.exists() and other_ns.exists()
    finally:
        for path in (dead, alive, other_ns):
            path.unlink(missing_ok=True)


class Gate:
    """Wraps ``RuntimeModel.run``: the first execution waits until :meth:`open`."""

    def __init__(self, server: RuntimeServer, monkeypatch: pytest.MonkeyPatch) -> None:
        self.real = server.core.run
        self.entered = threading.Event()
        self._open = threading.Event()
        monkeypatch.setattr(server.core, "run", self)

    def __call__(self, *args: Any) -> Any:
        self.entered.set()
        assert self._open.wait(30)
        return self.real(*args)

    def open(self) -> None:
        self._open.set()


def test_requests_round_trip_and_coalesce_across_fronts(
    server: RuntimeServer, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    answers = Answers()
    fronts = [front(server, key, answers) for _ in range(2)]
    gate = Gate(server, monkeypatch)
    try:
        x = EXPECTED["x"]
        fronts[0].submit([Request("first", {"x": x[:1]})])
        assert gate.entered.wait(10)  # the executor is busy: the next four wait in the sockets
        for i, f in enumerate(fronts * 2):
            f.submit([Request(i, {"x": x[i % 2 : i % 2 + 1]})])
        time.sleep(0.3)
        gate.open()
        results = answers.wait(5)
        for i in range(4):
            np.testing.assert_allclose(results[i]["y"], EXPECTED["y"][i % 2 : i % 2 + 1], 1e-6)
            np.testing.assert_array_equal(results[i]["label"], EXPECTED["label"][i % 2 : i % 2 + 1])
        assert server.items == 5 and server.executions == 3  # 1, then 2 x 2 from two fronts
    finally:
        for f in fronts:
            f.close()
    assert _segments(key) == []


def eventually(check: Any, timeout: float = 10.0) -> None:
    """Wait until ``check()`` is true (the runtime handles a disconnect on its own thread)."""
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.01)


def _segments(key: str) -> list[str]:
    return sorted(p.name for p in channel.SHM_DIR.glob(f"hloserve.channel-{key}-*"))


def test_bundles_are_held_by_reference_and_generation(
    server: RuntimeServer, key: str, tmp_path: Path
) -> None:
    answers = Answers()
    first = front(server, key, answers)
    second = front(server, key, answers)
    assert server.core.bundle_names == ["affine"]
    first.close()
    assert server.core.bundle_names == ["affine"]  # still held by the second instance
    copy = tmp_path / "affine"
    shutil.copytree(GOLDEN / "affine", copy)  # a reload: another generation of the model
    third = front(server, key, answers, bundle=copy)
    keys = sorted(e.key for e in server.core._entries.values())
    assert keys == ["affine", "affine#2"]  # the first instance's hold is gone, the second's not
    second.close()
    third.submit([Request("r", {"x": EXPECTED["x"]})])
    np.testing.assert_allclose(answers.wait(1)["r"]["y"], EXPECTED["y"], rtol=1e-6)
    third.close()
    eventually(lambda: server.core.bundle_names == [])
    assert _segments(key) == []


def test_a_bad_request_fails_alone_and_too_large_names_the_limit(
    server: RuntimeServer, key: str
) -> None:
    answers = Answers()
    f = front(server, key, answers, max_request_bytes=16)
    try:
        f.submit(
            [
                Request("ok", {"x": EXPECTED["x"][:1]}),
                Request("bad", {"x": np.zeros((1, 5), np.float32)}),
                Request("big", {"x": np.zeros((2, 4), np.float32)}),
            ]
        )
        results = answers.wait(3)
        assert isinstance(results["ok"], dict)
        assert results["bad"].status is Status.INVALID_ARGUMENT
        assert results["big"].status is Status.INVALID_ARGUMENT
        assert "limit of 16 bytes" in results["big"].message
    finally:
        f.close()


def test_a_bundle_that_fails_to_load_fails_the_front(
    server: RuntimeServer, key: str, tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(GOLDEN / "affine", broken)
    (broken / "model.b2.mlirbc").write_bytes(b"ML\xefR not a portable artifact")
    with pytest.raises(HloserveError, match="failed to load"):
        f = front(server, key, Answers(), bundle=broken, name="broken")
        f.close()


def test_an_execution_error_fails_only_its_requests(
    server: RuntimeServer, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    answers = Answers()
    f = front(server, key, answers)
    real = server.core.run
    calls = []

    def failing_once(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise HloserveError("device fell over", status=Status.INTERNAL)
        return real(*args)

    monkeypatch.setattr(server.core, "run", failing_once)
    try:
        f.submit([Request("a", {"x": EXPECTED["x"]})])
        assert answers.wait(1)["a"].message == "device fell over"
        f.submit([Request("b", {"x": EXPECTED["x"]})])
        assert isinstance(answers.wait(2)["b"], dict)
    finally:
        f.close()


def test_a_large_request_goes_through_its_own_segment(server: RuntimeServer, key: str) -> None:
    answers = Answers()
    f = front(server, key, answers, arena_bytes=4096)
    try:
        x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
        f.arena.allocate(4000)  # the arena is full: the next request needs its own segment
        f.submit([Request("r", {"x": x})])
        y = answers.wait(1)["r"]["y"]
        assert y.shape == (2, 3)
        assert len(_segments(key)) == 1  # the overflow segment is gone, the arena stays
    finally:
        f.close()


def test_runtime_going_away_fails_in_flight_then_fronts_reconnect(
    key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    addr = f"\0hloserve.channel-test-{uuid.uuid4().hex}"
    srv = _runtime_at(addr, key)
    answers = Answers()
    f = _affine_front(addr, key, answers)
    gate = Gate(srv, monkeypatch)
    try:
        f.submit([Request("lost", {"x": EXPECTED["x"]})])
        assert gate.entered.wait(10)  # in flight
        for conn in list(srv._connections):
            conn.sock.shutdown(2)
        assert answers.wait(1)["lost"].status is Status.UNAVAILABLE
        gate.open()
        srv.close()
        again = _runtime_at(addr, key)
        try:
            f.submit([Request("after", {"x": EXPECTED["x"]})])  # waits for the reconnect
            np.testing.assert_allclose(answers.wait(2)["after"]["y"], EXPECTED["y"], rtol=1e-6)
        finally:
            f.close()
            again.close()
    finally:
        srv.close()
    assert _segments(key) == []


def test_an_inline_front_answers_before_run_returns(server: RuntimeServer, key: str) -> None:
    answers = Answers()
    f = front(server, key, answers, max_request_bytes=16, inline=True)
    try:
        f.run(
            [
                Request("ok", {"x": EXPECTED["x"][:1]}),
                Request("bad", {"x": np.zeros((1, 5), np.float32)}),
                Request("two", {"x": EXPECTED["x"][1:2]}),
            ]
        )
        results = dict(answers.results)  # no wait: run() returned after every answer
        assert set(results) == {"ok", "bad", "two"}
        np.testing.assert_allclose(results["ok"]["y"], EXPECTED["y"][:1], rtol=1e-6)
        np.testing.assert_allclose(results["two"]["y"], EXPECTED["y"][1:2], rtol=1e-6)
        assert results["bad"].status is Status.INVALID_ARGUMENT
        assert f.in_flight == 0
        with pytest.raises(AssertionError, match="run"):
            f.submit([Request("no", {"x": EXPECTED["x"][:1]})])
    finally:
        f.close()
    assert _segments(key) == []


def test_an_inline_run_returns_only_after_the_watcher_answered_its_requests(
    key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hang-up watcher may fail the in-flight works before run() sees the closed socket:
    run() must still return only once they are answered (the Triton shim returns the responses
    from execute; a missing one hangs the client)."""
    addr = f"\0hloserve.channel-test-{uuid.uuid4().hex}"
    srv = _runtime_at(addr, key)
    answers = Answers()

    def slow(handle: Any, result: Any) -> None:
        time.sleep(0.3)  # answering takes a while: run() must wait for it
        answers(handle, result)

    f = _affine_front(addr, key, slow, inline=True)
    gate = Gate(srv, monkeypatch)
    try:
        running = threading.Thread(target=f.run, args=([Request("lost", {"x": EXPECTED["x"]})],))
        running.start()
        assert gate.entered.wait(10)
        link = f._link
        assert link is not None
        watcher = threading.Thread(target=f._lost, args=(link,))  # as the watcher does
        watcher.start()
        running.join(10)
        assert not running.is_alive()
        assert answers.results["lost"].status is Status.UNAVAILABLE  # answered before returning
        watcher.join(10)
    finally:
        gate.open()
        f.close()
        srv.close()
    assert _segments(key) == []


def test_an_inline_front_fails_in_flight_when_the_runtime_goes_then_reconnects(
    key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    addr = f"\0hloserve.channel-test-{uuid.uuid4().hex}"
    srv = _runtime_at(addr, key)
    answers = Answers()
    f = _affine_front(addr, key, answers, inline=True)
    gate = Gate(srv, monkeypatch)
    try:
        running = threading.Thread(target=f.run, args=([Request("lost", {"x": EXPECTED["x"]})],))
        running.start()
        assert gate.entered.wait(10)  # in flight, run() is reading on its thread
        started = time.monotonic()
        for conn in list(srv._connections):
            conn.sock.shutdown(2)
        running.join(10)
        assert not running.is_alive()
        assert time.monotonic() - started < 1.0
        assert answers.results["lost"].status is Status.UNAVAILABLE
        gate.open()
        srv.close()
        again = _runtime_at(addr, key)
        try:
            f.run([Request("after", {"x": EXPECTED["x"]})])  # waits for the reconnect
            np.testing.assert_allclose(answers.results["after"]["y"], EXPECTED["y"], rtol=1e-6)
        finally:
            f.close()
            again.close()
    finally:
        srv.close()
    assert _segments(key) == []


def test_a_request_not_sent_yet_when_the_runtime_goes_waits_for_the_next_one(
    key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request placed in the arena but not sent when the runtime goes away never reached it:
    it waits for the next runtime and succeeds (only the works sent over a lost link fail)."""
    addr = f"\0hloserve.channel-test-{uuid.uuid4().hex}"
    srv = _runtime_at(addr, key)
    answers = Answers()
    f = _affine_front(addr, key, answers, inline=True)
    placed, go = threading.Event(), threading.Event()
    send_works = f._send_works

    def paused(works: list[dict[str, Any]], ids: list[int]) -> Any:
        placed.set()
        assert go.wait(10)
        return send_works(works, ids)

    monkeypatch.setattr(f, "_send_works", paused)
    again: RuntimeServer | None = None
    try:
        running = threading.Thread(target=f.run, args=([Request("late", {"x": EXPECTED["x"]})],))
        running.start()
        assert placed.wait(10) and f.in_flight == 1  # placed, not sent
        for conn in list(srv._connections):
            conn.sock.shutdown(2)
        deadline = time.monotonic() + 10
        while f._ready.is_set() or f._link is not None:  # the watcher saw the hang-up
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert "late" not in answers.results  # not failed with the runtime it never met
        srv.close()
        again = _runtime_at(addr, key)
        go.set()
        running.join(30)
        assert not running.is_alive()
        np.testing.assert_allclose(answers.results["late"]["y"], EXPECTED["y"], rtol=1e-6)
        assert f.in_flight == 0
    finally:
        go.set()
        f.close()
        if again is not None:
            again.close()
        srv.close()
    assert _segments(key) == []


def test_two_fronts_of_one_process_never_share_a_segment_name(
    server: RuntimeServer, key: str
) -> None:
    """Segment names carry the process's pid and a number: the number is the process's, not
    the front's, so a second front never replaces the first one's arena file (the runtime
    would then map the wrong arena for the first front's next hello)."""
    answers = Answers()
    fronts = [front(server, key, answers) for _ in range(2)]
    try:
        first, second = (f.arena.segment for f in fronts)
        assert first.name != second.name
        assert first.path.exists() and second.path.exists()
        assert os.stat(first.path).st_ino != os.stat(second.path).st_ino
    finally:
        for f in fronts:
            f.close()
    assert _segments(key) == []


def _slow_runtime(addr: str, key: str, seconds: float) -> RuntimeServer:
    """A started runtime whose every compile takes ``seconds`` longer (a big graph's compile)."""
    from hloserve.triton_backend.runtime.compile import compile_artifact

    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(seconds)
        return compile_artifact(*args, **kwargs)

    srv = RuntimeServer(RuntimeModel(compile=slow), address=addr, key=key, flush_interval_s=0.05)
    srv.start()
    return srv


def test_start_waits_for_a_runtime_that_listens_later_and_returns_loaded(key: str) -> None:
    addr = f"\0hloserve.channel-test-{uuid.uuid4().hex}"
    servers: list[RuntimeServer] = []
    later = threading.Timer(0.5, lambda: servers.append(_runtime_at(addr, key)))
    later.start()
    begun = time.monotonic()
    f = _affine_front(addr, key, Answers())
    try:
        assert time.monotonic() - begun >= 0.4
        assert f._ready.is_set()  # start returned with the bundle accepted: servable now
    finally:
        f.close()
        later.join()
        for srv in servers:
            srv.close()


def test_start_follows_compile_progress_beyond_its_wait_and_fails_when_it_stalls(
    key: str,
) -> None:
    addr = f"\0hloserve.channel-test-{uuid.uuid4().hex}"
    srv = _slow_runtime(addr, key, 1.5)  # two executables: 3 s of compile, progress each 1.5 s
    try:
        core = FrontModel("affine", load_bundle(GOLDEN / "affine"))
        begun = time.monotonic()
        f = ChannelFront(core, GOLDEN / "affine", Answers(), address=addr, key=key)
        f.start(wait_s=2.5)
        try:
            assert 3.0 <= time.monotonic() - begun < 20  # longer than wait_s: it moved on
            assert f._ready.is_set()
        finally:
            f.close()
    finally:
        srv.close()
    addr = f"\0hloserve.channel-test-{uuid.uuid4().hex}"
    srv = _slow_runtime(addr, key, 3.0)  # no progress for 3 s: the wait of 1 s runs out
    try:
        core = FrontModel("affine", load_bundle(GOLDEN / "affine"))
        f = ChannelFront(core, GOLDEN / "affine", Answers(), address=addr, key=key)
        with pytest.raises(HloserveError, match=r"no compile progress for 1 s") as info:
            f.start(wait_s=1.0)
        assert info.value.status == Status.UNAVAILABLE
    finally:
        srv.close()


def test_start_without_a_runtime_stub_stops_waiting_after_the_grace_and_loads_later(
    key: str,
) -> None:
    addr = f"\0hloserve.channel-test-{uuid.uuid4().hex}"
    core = FrontModel("affine", load_bundle(GOLDEN / "affine"))
    f = ChannelFront(core, GOLDEN / "affine", Answers(), address=addr, key=key)
    begun = time.monotonic()
    f.start(wait_s=0.3)  # no runtime stub beside this process: waiting could deadlock Triton
    try:
        assert 0.25 <= time.monotonic() - begun < 5
        assert not f._ready.is_set()
        srv = _runtime_at(addr, key)
        try:
            assert f._wait_ready(30)  # loaded in the background once the runtime came
        finally:
            srv.close()
    finally:
        f.close()


def test_start_with_a_runtime_stub_that_never_listens_fails_unavailable_naming_the_wait(
    key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(channel, "runtime_stub_running", lambda model: model == "hloserve_runtime")
    addr = f"\0hloserve.channel-test-{uuid.uuid4().hex}"
    core = FrontModel("affine", load_bundle(GOLDEN / "affine"))
    f = ChannelFront(core, GOLDEN / "affine", Answers(), address=addr, key=key)
    begun = time.monotonic()
    with pytest.raises(HloserveError, match=r"not listening after 0\.3 s") as info:
        f.start(wait_s=0.3)
    assert info.value.status == Status.UNAVAILABLE
    assert 0.25 <= time.monotonic() - begun < 5


def test_runtime_stub_running_finds_only_a_sibling_stub_of_that_model(tmp_path: Path) -> None:
    import subprocess
    import sys

    model_py = tmp_path / "hloserve_runtime" / "1" / "model.py"
    model_py.parent.mkdir(parents=True)
    model_py.write_text("import time\ntime.sleep(30)\n")
    # a child that starts a "stub" child of its own and asks whether it runs beside itself
    probe = (
        "import subprocess, sys, time\n"
        "from hloserve.triton_backend import channel\n"
        "before = channel.runtime_stub_running('hloserve_runtime')\n"
        f"stub = subprocess.Popen([sys.executable, {str(model_py)!r}])\n"
        "time.sleep(0.2)\n"
        "# the probe is the stub's parent, not its sibling: a grandchild asks\n"
        "code = 'from hloserve.triton_backend import channel; "
        'print(channel.runtime_stub_running("hloserve_runtime"), '
        'channel.runtime_stub_running("other"))\'\n'
        "out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)\n"
        "stub.kill()\n"
        "print(before, out.stdout.strip(), out.stderr[-500:])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split()[:3] == ["False", "True", "False"], out
