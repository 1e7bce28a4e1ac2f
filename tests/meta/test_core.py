"""The meta core without Triton: call, deadline, gate, run loading, and the meta's config.

Sub-calls go to a stand-in ``send`` (pure logic); the gate is real (lock files in tmp_path).
"""

from __future__ import annotations

import copy
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from hloserve.bundle.bundle import load_bundle
from hloserve.errors import BundleError, DeadlineExceededError, HloserveError, NotFoundError, Status
from hloserve.meta.core import MetaCall, MetaModel, load_run, repository_describer
from hloserve.meta.deadline import Deadline
from hloserve.meta.gate import MetaGate, remove_stale_gates, server_gate_dir
from tests.conftest import GOLDEN

META: dict[str, Any] = {
    "format_version": 2,
    "kind": "meta",
    "meta": {"calls": ["affine"]},
    "client_inputs": [{"name": "x", "dtype": "f32", "shape": "nk", "dims": {"k": 4}}],
    "client_outputs": [{"name": "y", "dtype": "f32", "shape": "nj", "dims": {"j": 3}}],
}
RUN = "def run(inputs, call):\n    return call('affine', inputs, ['y'])\n"
X = np.ones((2, 4), np.float32)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Send:
    """Records sub-calls; answers y = x[:, :3] * 2, or raises ``error``."""

    def __init__(self, error: Exception | None = None) -> None:
        self.calls: list[tuple[str, list[str], int]] = []
        self.error = error

    def __call__(self, model: str, inputs: Any, outputs: Any, timeout_us: int) -> Any:
        self.calls.append((model, list(outputs), timeout_us))
        if self.error is not None:
            raise self.error
        return {"y": inputs["x"][:, :3] * 2}


def write_meta(root: Path, name: str = "m", run: str = RUN, **changes: Any) -> Path:
    path = root / name
    path.mkdir(parents=True)
    data = copy.deepcopy(META)
    data.update(changes)
    (path / "manifest.yaml").write_text(yaml.safe_dump(data))
    (path / "model.py").write_text(run)
    return path


def meta_model(tmp_path: Path, send: Send, run: str = RUN, **kw: Any) -> MetaModel:
    path = write_meta(tmp_path, run=run)
    return MetaModel("m", load_bundle(path), load_run(path / "model.py", "m"), send, **kw)


def test_call_passes_the_time_left_and_the_requested_outputs() -> None:
    clock, send = Clock(), Send()
    call = MetaCall("m", ["affine"], send, Deadline(clock.now + 0.25, clock), clock=clock)
    out = call("affine", {"x": X}, ["y"])
    np.testing.assert_array_equal(out["y"], X[:, :3] * 2)
    assert send.calls == [("affine", ["y"], 250_000)]
    no_deadline = MetaCall("m", ["affine"], send, Deadline(None))
    no_deadline("affine", {"x": X})
    assert send.calls[-1] == ("affine", [], 0)


def test_undeclared_call_sends_nothing() -> None:
    send = Send()
    call = MetaCall("m", ["affine"], send, Deadline(None))
    with pytest.raises(HloserveError) as info:
        call("digits", {"x": X})
    assert info.value.status is Status.INVALID_ARGUMENT
    assert "model 'm': run called model 'digits', which is not in its meta.calls" in str(info.value)
    assert send.calls == []


def test_call_after_the_deadline_sends_nothing() -> None:
    clock, send = Clock(), Send()
    call = MetaCall("m", ["affine"], send, Deadline(clock.now + 0.1, clock), clock=clock)
    clock.now += 0.2
    with pytest.raises(DeadlineExceededError, match="deadline exceeded before calling model"):
        call("affine", {"x": X})
    assert send.calls == []


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (HloserveError("bad x", status=Status.INVALID_ARGUMENT), Status.INVALID_ARGUMENT),
        (HloserveError("Request for unknown model 'a'", status=Status.INTERNAL), Status.NOT_FOUND),
        (HloserveError("Request timeout expired", status=Status.UNAVAILABLE), None),
        (RuntimeError("boom"), Status.INTERNAL),
    ],
)
def test_callee_errors_keep_their_status_and_name_both_models(
    error: Exception, status: Status | None
) -> None:
    call = MetaCall("m", ["affine"], Send(error), Deadline(None))
    with pytest.raises(HloserveError) as info:
        call("affine", {"x": X})
    if status is None:
        assert isinstance(info.value, DeadlineExceededError)
        assert "model 'm': deadline exceeded in the call to model 'affine'" in str(info.value)
    else:
        assert info.value.status is status
        assert str(info.value).startswith("model 'm': call to model 'affine' failed: ")


def test_callee_inputs_are_checked_against_its_bundle(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(GOLDEN / "affine", repo / "affine" / "1" / "bundle")
    describe = repository_describer(repo)
    send = Send()
    call = MetaCall("m", ["affine", "ghost"], send, Deadline(None), describe=describe)
    with pytest.raises(HloserveError, match="call to model 'affine': model 'affine': input 'x'"):
        call("affine", {"x": np.ones((1, 5), np.float32)})
    with pytest.raises(HloserveError, match="call to model 'affine': batch size 0; a call needs"):
        call("affine", {"x": np.ones((0, 4), np.float32)})
    with pytest.raises(NotFoundError, match="model 'ghost' is not served by this worker"):
        call("ghost", {"x": X})
    assert send.calls == []
    call("affine", {"x": X})
    assert len(send.calls) == 1


def test_a_batch_larger_than_the_callee_takes_is_sent_in_chunks(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(GOLDEN / "affine", repo / "affine" / "1" / "bundle")  # batch sizes 1, 2
    sizes: list[int] = []

    def send(model: str, inputs: Any, outputs: Any, timeout_us: int) -> Any:
        sizes.append(len(inputs["x"]))
        return {
            "y": inputs["x"][:, :3] * 2,
            "n": np.array([f"{len(inputs['x'])}".encode()] * len(inputs["x"]), dtype=object),
        }

    clock = Clock()
    call = MetaCall(
        "m",
        ["affine"],
        send,
        Deadline(clock.now + 1, clock),
        describe=repository_describer(repo),
        clock=clock,
    )
    x = np.arange(20, dtype=np.float32).reshape(5, 4)
    out = call("affine", {"x": x})
    assert sizes == [2, 2, 1] and call.calls_made == 3
    np.testing.assert_array_equal(out["y"], x[:, :3] * 2)  # in order
    assert out["n"].tolist() == [b"2", b"2", b"2", b"2", b"1"]  # bytes outputs too

    def late(model: str, inputs: Any, outputs: Any, timeout_us: int) -> Any:
        clock.now += 2  # the deadline passes during the first chunk
        return send(model, inputs, outputs, timeout_us)

    sizes.clear()
    slow = MetaCall(
        "m", ["affine"], late, Deadline(clock.now + 1, clock), describe=repository_describer(repo)
    )
    with pytest.raises(DeadlineExceededError, match="before calling model 'affine'"):
        slow("affine", {"x": x})
    assert sizes == [2]  # nothing sent after the deadline


def test_zero_rows_are_refused_before_run(tmp_path: Path) -> None:
    send = Send()
    model = meta_model(tmp_path, send)
    with pytest.raises(HloserveError) as info:
        model.execute({"x": np.ones((0, 4), np.float32)})
    assert info.value.status is Status.INVALID_ARGUMENT
    assert "model 'm': batch size 0; a request needs at least one item" in str(info.value)
    assert send.calls == []


def test_meta_model_runs_and_checks_tensors(tmp_path: Path) -> None:
    send = Send()
    model = meta_model(tmp_path, send)
    np.testing.assert_array_equal(model.execute({"x": X})["y"], X[:, :3] * 2)
    with pytest.raises(HloserveError, match="model 'm': input 'x': expected dtype FP32"):
        model.execute({"x": X.astype(np.float64)})


@pytest.mark.parametrize(
    ("run", "expected"),
    [
        ("def run(inputs, call):\n    return {'y': inputs['x']}\n", "output 'y': expected shape"),
        ("def run(inputs, call):\n    return [1]\n", "run returned list, expected a dict"),
        ("def run(inputs, call):\n    raise KeyError('k')\n", "run raised KeyError"),
    ],
)
def test_bad_run_is_internal_and_named(tmp_path: Path, run: str, expected: str) -> None:
    with pytest.raises(HloserveError) as info:
        meta_model(tmp_path, Send(), run=run).execute({"x": X})
    assert info.value.status is Status.INTERNAL and expected in str(info.value)
    assert "model 'm'" in str(info.value)


def test_load_run_refusals(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import no_such_module_here\n")
    with pytest.raises(HloserveError, match=r"importing .* failed: ModuleNotFoundError"):
        load_run(bad, "m")
    bad.write_text("run = 3\n")
    with pytest.raises(HloserveError, match="defines no function run"):
        load_run(bad, "m")
    with pytest.raises(NotFoundError):
        load_run(tmp_path / "absent.py", "m")


def test_gate_admits_slots_holders_and_sheds_at_the_deadline(tmp_path: Path) -> None:
    clock = Clock()
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        clock.now += s

    gate = MetaGate(tmp_path / "gate", 2, sleep=sleep)
    other = MetaGate(tmp_path / "gate", 2)  # another process would open the same files
    with gate.permit("a", Deadline(None)), other.permit("b", Deadline(None)):
        assert gate.try_acquire() is None
        with (
            pytest.raises(DeadlineExceededError, match="waiting for the meta gate"),
            gate.permit("c", Deadline(clock.now + 0.05, clock)),
        ):
            pass
        assert sum(sleeps) == pytest.approx(0.05)  # waited until the deadline, not longer
    with gate.permit("c", Deadline(None)):  # both released
        pass


def test_gate_serializes_threads(tmp_path: Path) -> None:
    gate = MetaGate(tmp_path / "gate", 1)
    inside: list[int] = []
    most = [0]
    entered = [0]
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(20):
            with gate.permit("m", Deadline(None)):
                with lock:
                    inside.append(1)
                    most[0] = max(most[0], len(inside))
                    entered[0] += 1
                with lock:
                    inside.pop()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a thread never got through the gate"
    assert entered[0] == 3 * 20  # every permit was granted, none skipped
    assert most[0] == 1


def test_compute_only_meta_skips_the_gate(tmp_path: Path) -> None:
    gate = MetaGate(tmp_path / "gate", 1)
    path = write_meta(
        tmp_path, run="def run(inputs, call):\n    return {'y': inputs['x'][:, :3]}\n"
    )
    data = yaml.safe_load((path / "manifest.yaml").read_text())
    data["meta"]["calls"] = []
    (path / "manifest.yaml").write_text(yaml.safe_dump(data))
    model = MetaModel("m", load_bundle(path), load_run(path / "model.py", "m"), Send(), gate=gate)
    with gate.permit("other", Deadline(None)):  # the only permit is taken
        assert model.execute({"x": X})["y"].shape == (2, 3)


def test_stale_gate_directories_are_removed(tmp_path: Path) -> None:
    live = server_gate_dir(os.getpid())
    live.mkdir(exist_ok=True)
    dead = server_gate_dir(2**22 + 12345)  # above the default pid_max: never running
    dead.mkdir(exist_ok=True)
    assert dead in remove_stale_gates()
    assert live.exists() and not dead.exists()
    live.rmdir()


def test_repository_build_emits_the_meta_config(tmp_path: Path) -> None:
    pytest.importorskip("tritonclient.grpc")  # Triton's model_config_pb2
    from hloserve.model_repository_tools.build import build_repository
    from hloserve.model_repository_tools.validate import validate_repository

    bundles = tmp_path / "bundles"
    shutil.copytree(GOLDEN / "affine", bundles / "affine")
    write_meta(bundles, "cascade")
    repo = tmp_path / "repo"
    plan = build_repository(bundles, repo, meta_concurrency=3)
    assert [m.name for m in plan.models] == ["affine", "cascade"]
    text = (repo / "cascade" / "config.pbtxt").read_text()
    golden = GOLDEN / "repository" / "meta.config.pbtxt"
    if os.environ.get("HLOSERVE_REGEN_GOLDEN") == "1":
        golden.write_text(text)
    assert text == golden.read_text(), f"{golden} differs (HLOSERVE_REGEN_GOLDEN=1 to update)"
    runtime = (repo / "hloserve_runtime" / "config.pbtxt").read_text()
    assert "cascade" not in runtime  # a meta has no executable
    assert validate_repository(repo) == []
    (repo / "cascade" / "config.pbtxt").write_text(text.replace('"3"', '"4"'))
    assert "does not match what its bundle gives" in str(validate_repository(repo))


def test_repository_build_refuses_a_meta_calling_what_is_not_built(tmp_path: Path) -> None:
    pytest.importorskip("tritonclient.grpc")  # Triton's model_config_pb2
    from hloserve.model_repository_tools.build import build_repository

    bundles = tmp_path / "bundles"
    shutil.copytree(GOLDEN / "affine", bundles / "affine")
    write_meta(bundles, "cascade", meta={"calls": ["affine", "digits"]})
    with pytest.raises(BundleError, match="model 'digits' is not among the bundles being built"):
        build_repository(bundles, tmp_path / "repo")
    assert not (tmp_path / "repo").exists()
