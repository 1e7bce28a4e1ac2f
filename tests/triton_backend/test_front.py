"""The front over the channel (hloserve.triton_backend.front.core, front_channel): validation,
coalescing and padding by the runtime's scheduler, hooks, errors, waiting for the runtime.

The fronts are inline :class:`ChannelFront` instances over an in-process :class:`RuntimeServer`
(tests/triton_backend/front_testing.py), the path the ``hloserve_front`` shim takes minus
Triton; the recorded executions show what the scheduler coalesced (docs/scheduling.md,
"Coalescing").
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hloserve
from hloserve.bundle.bundle import load_bundle
from hloserve.errors import HloserveError, InvalidArgumentError, Status, UnavailableError
from hloserve.model_parameters import ModelArgs
from hloserve.triton_backend.front.core import FrontModel, Tensors
from hloserve.triton_backend.runtime.server import RuntimeServer
from tests.conftest import GOLDEN, TINY_PARAMS
from tests.triton_backend.front_testing import (
    Front,
    RecordingRuntime,
    front,
    ok,
    runtime_server,
    server_key,
)
from tests.triton_backend.test_bundles import TRANSPOSED_W, export_transposed, export_unbatched

pytestmark = pytest.mark.usefixtures("restore_x64")


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory, tiny_bundle_src: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("front_bundles")
    return {
        "affine": GOLDEN / "affine",
        "tiny": tiny_bundle_src,
        "transposed": export_transposed(root / "transposed"),
        "unbatched": export_unbatched(root / "unbatched"),
    }


@pytest.fixture(scope="module")
def server() -> Iterator[RuntimeServer]:
    with runtime_server() as srv:
        yield srv


def _calls(server: RuntimeServer) -> list[tuple[int, tuple[tuple[int, ...], ...]]]:
    """(batch size, input shapes) of each execution since the front started."""
    runtime = server.core
    assert isinstance(runtime, RecordingRuntime)
    return [(e.batch_size, e.shapes) for e in runtime.calls]


def _tiny(x: np.ndarray) -> Tensors:
    return {"y": x @ TINY_PARAMS["w"] + TINY_PARAMS["b"], "s": x.sum(axis=-1)}


def test_affine_requests_are_coalesced_and_padded(
    paths: dict[str, Path], server: RuntimeServer
) -> None:
    expected = np.load(GOLDEN / "affine.expected.npz")
    x, y, label = expected["x"], expected["y"], expected["label"]
    with front(server, "affine", paths["affine"]) as f:
        results = f.execute([{"x": x[:1]}, {"x": x[1:]}, {"x": x}])
        # compiled [1, 2]: (r0 + r1) at 2, then r2 at 2
        assert _calls(server) == [(2, ((2, 4),)), (2, ((2, 4),))]
    np.testing.assert_allclose(ok(results[0])["y"], y[:1], rtol=1e-6)
    np.testing.assert_allclose(ok(results[1])["y"], y[1:], rtol=1e-6)
    np.testing.assert_allclose(ok(results[2])["y"], y, rtol=1e-6)
    assert ok(results[2])["label"].tolist() == label.tolist()


@pytest.mark.parametrize(
    ("rows", "executions"),
    [
        # compiled [1, 4]: 3 queued rows fill size 1 only, never padded up to 4
        ([1, 1, 1], [(1, ((1, 4),))] * 3),
        # a head of 2 rows grows the target to 4; the next request rides along, 1 row padded
        ([2, 1], [(4, ((4, 4),))]),
        ([2, 2, 1], [(4, ((4, 4),)), (1, ((1, 4),))]),
    ],
)
def test_tiny_coalesces_by_the_schedulers_rule(
    paths: dict[str, Path],
    server: RuntimeServer,
    rows: list[int],
    executions: list[tuple[int, tuple[tuple[int, ...], ...]]],
) -> None:
    xs = [np.full((n, 4), i, np.float32) for i, n in enumerate(rows)]
    with front(server, "tiny", paths["tiny"]) as f:
        results = f.execute([{"x": x} for x in xs])
        assert _calls(server) == executions
    for x, result in zip(xs, results, strict=True):
        np.testing.assert_allclose(ok(result)["y"], _tiny(x)["y"], rtol=1e-6)
        np.testing.assert_allclose(ok(result)["s"], _tiny(x)["s"])


def test_bad_requests_fail_alone(paths: dict[str, Path], server: RuntimeServer) -> None:
    first = {"x": np.ones((2, 4), np.float32)}
    last = {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}  # unlike the first: order shows
    with front(server, "tiny", paths["tiny"]) as f:
        results = f.execute(
            [
                first,
                {"x": np.ones((1, 4), np.float64)},
                {"x": np.ones((1, 3), np.float32)},
                {},
                {"x": np.ones((1, 4), np.float32), "extra": np.ones(1)},
                {"x": np.ones((5, 4), np.float32)},
                {"x": np.ones((0, 4), np.float32)},
                InvalidArgumentError("unreadable tensor"),
                last,
            ]
        )
        assert _calls(server) == [(4, ((4, 4),))]  # the two good requests, together
    errors = results[1:8]
    assert all(isinstance(r, HloserveError) for r in errors), results
    assert all(r.status is Status.INVALID_ARGUMENT for r in errors)  # type: ignore[union-attr]
    messages = [str(r) for r in errors]
    assert messages[0] == "model 'tiny': input 'x': expected dtype FP32 (f32), got FP64 (f64)"
    assert "expected shape [-1, 4], got [1, 3]" in messages[1]
    assert "missing input 'x'" in messages[2]
    assert "unknown input 'extra'" in messages[3]
    assert "batch size 5 is outside 1 to 4" in messages[4]
    assert "batch size 0 is outside 1 to 4" in messages[5]
    assert messages[6] == "unreadable tensor"
    for good, result in ((first, results[0]), (last, results[8])):  # the expected answers
        want = _tiny(good["x"])
        np.testing.assert_allclose(ok(result)["y"], want["y"], rtol=1e-6)
        np.testing.assert_array_equal(ok(result)["s"], want["s"])


def test_non_leading_batch_axis(paths: dict[str, Path], server: RuntimeServer) -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(2, dtype=np.float32).reshape(2, 1) + 100
    with front(server, "transposed", paths["transposed"]) as f:
        results = f.execute([{"x": a}, {"x": b}, {"x": np.ones((2, 5), np.float32)}])
        assert _calls(server) == [(4, ((2, 4),))]  # 3 + 1 items, joined on axis 1
    for x, result in zip((a, b), results[:2], strict=True):
        np.testing.assert_array_equal(ok(result)["y"], x.T * TRANSPOSED_W)
        np.testing.assert_array_equal(ok(result)["z"], x + 1)
    assert isinstance(results[2], InvalidArgumentError)
    assert "batch size 5 is outside 1 to 4" in str(results[2])


def test_unbatched_runs_one_request_per_execution(
    paths: dict[str, Path], server: RuntimeServer
) -> None:
    xs = [np.array([1.0, 2.0, 3.0], np.float32), np.zeros(3, np.float32)]
    with front(server, "unbatched", paths["unbatched"]) as f:
        results = f.execute([{"x": x} for x in xs])
        assert _calls(server) == [(0, ((3,),)), (0, ((3,),))]
    for x, result in zip(xs, results, strict=True):
        np.testing.assert_array_equal(ok(result)["y"], x * 2 + [1.0, 2.0, 3.0])


def test_runtime_errors_fail_only_their_execution(
    paths: dict[str, Path], server: RuntimeServer
) -> None:
    runtime = server.core
    assert isinstance(runtime, RecordingRuntime)

    def fail(inputs: Sequence[np.ndarray]) -> Exception | None:
        bad = (inputs[0] < 0).any()
        return HloserveError("boom", status=Status.INVALID_ARGUMENT) if bad else None

    with front(server, "tiny", paths["tiny"]) as f:
        runtime.fail = fail
        try:
            results = f.execute(
                [{"x": -np.ones((4, 4), np.float32)}, {"x": np.ones((4, 4), np.float32)}]
            )
        finally:
            runtime.fail = None
        assert len(_calls(server)) == 2
    assert isinstance(results[0], HloserveError) and results[0].message == "boom"
    assert results[0].status is Status.INVALID_ARGUMENT  # the runtime's status reaches it
    np.testing.assert_allclose(ok(results[1])["y"], _tiny(np.ones((4, 4), np.float32))["y"], 1e-6)


def test_requests_wait_for_a_runtime_that_comes_late(paths: dict[str, Path]) -> None:
    """Triton loads models in parallel: a front may start before the runtime listens; its
    requests wait for it (up to ``hloserve.runtime_wait_s``) and succeed."""
    address = f"\0hloserve.channel-test-{uuid.uuid4().hex}"
    late: list[RuntimeServer] = []
    f = Front(None, "tiny", paths["tiny"], wait_s=60.0, address=address)
    try:
        results: list[Any] = []
        sending = threading.Thread(
            target=lambda: results.extend(f.execute([{"x": np.ones((1, 4), np.float32)}]))
        )
        sending.start()
        sending.join(0.3)
        assert sending.is_alive()  # waiting: nothing listens yet
        srv = RuntimeServer(
            RecordingRuntime(), address=address, key=server_key(), flush_interval_s=0.05
        )
        late.append(srv)
        srv.start()
        sending.join(60)
        assert not sending.is_alive()
        want = _tiny(np.ones((1, 4), np.float32))["y"]
        np.testing.assert_allclose(ok(results[0])["y"], want, rtol=1e-6)
    finally:
        f.close()
        for srv in late:
            srv.close()


def test_gives_up_after_the_wait_with_unavailable(paths: dict[str, Path]) -> None:
    address = f"\0hloserve.channel-test-{uuid.uuid4().hex}"  # no runtime ever listens here
    f = Front(None, "tiny", paths["tiny"], wait_s=0.3, address=address)
    try:
        [result] = f.execute([{"x": np.ones((1, 4), np.float32)}])
    finally:
        f.close()
    assert isinstance(result, UnavailableError)
    assert str(result) == "model 'tiny': runtime not reachable after 0.3 s"


class ScaleHooks:
    """Doubles x before the executable; adds an output; refuses a marked request afterwards."""

    def preprocess(self, inputs: Tensors) -> Tensors:
        if (inputs["x"] < 0).any():
            raise InvalidArgumentError("preprocess refused")
        return {"x": inputs["x"] * 2}

    def postprocess(self, outputs: Tensors, inputs: Tensors) -> Tensors:
        if (outputs["s"] == 0).any():
            raise InvalidArgumentError("postprocess refused")
        return {**outputs, "twice_s": outputs["s"] * 2}


def test_hooks_wrap_each_request(paths: dict[str, Path], server: RuntimeServer) -> None:
    one = np.ones((1, 4), np.float32)
    with front(server, "tiny", paths["tiny"], hooks=ScaleHooks()) as f:
        results = f.execute([{"x": one}, {"x": -one}, {"x": np.zeros((1, 4), np.float32)}])
        # requests 0 and 2: 2 rows fill size 1 only (compiled [1, 4])
        assert _calls(server) == [(1, ((1, 4),)), (1, ((1, 4),))]
    out = ok(results[0])
    np.testing.assert_array_equal(out["s"], [8.0])  # sum of 2 * ones(4)
    np.testing.assert_array_equal(out["twice_s"], [16.0])
    assert str(results[1]) == "preprocess refused"
    assert str(results[2]) == "postprocess refused"


def _args(tmp_path: Path, **params: str) -> ModelArgs:
    return ModelArgs(
        name="tiny",
        model_dir=tmp_path,
        version="1",
        config={"parameters": {k: {"string_value": v} for k, v in params.items()}},
    )


def test_from_args(tmp_path: Path, tiny_bundle_src: Path) -> None:
    front = FrontModel.from_args(
        _args(
            tiny_bundle_src.parent,
            **{"hloserve.bundle": "tiny", "hloserve.runtime_wait_s": "2.5"},
        ),
    )
    assert front.bundle.path == tiny_bundle_src and front.runtime_wait_s == 2.5
    assert front.runtime_model == "hloserve_runtime"
    with pytest.raises(InvalidArgumentError, match=r"lacks parameter 'hloserve\.bundle'"):
        FrontModel.from_args(_args(tmp_path))
    with pytest.raises(InvalidArgumentError, match="repository format '9' is not supported"):
        FrontModel.from_args(
            _args(tmp_path, **{"hloserve.repository_format": "9", "hloserve.bundle": "x"})
        )
    with pytest.raises(InvalidArgumentError, match="must be a number of seconds"):
        FrontModel.from_args(
            _args(
                tiny_bundle_src.parent,
                **{"hloserve.bundle": "tiny", "hloserve.runtime_wait_s": "soon"},
            ),
        )
    # a repository built with a UINT64 CORRID (a string sequence ID killed the server)
    args = _args(tiny_bundle_src.parent, **{"hloserve.bundle": "tiny"})
    corrid = {"kind": "CONTROL_SEQUENCE_CORRID", "data_type": "TYPE_UINT64"}
    start = {"kind": "CONTROL_SEQUENCE_START", "int32_false_true": [0, 1]}
    controls = [{"name": "START", "control": [start]}, {"name": "CORRID", "control": [corrid]}]
    config = {**args.config, "sequence_batching": {"control_input": controls}}
    with pytest.raises(InvalidArgumentError) as info:
        FrontModel.from_args(dataclasses.replace(args, config=config))
    assert str(info.value).startswith(
        "model 'tiny': its config has the CONTROL_SEQUENCE_CORRID input 'CORRID'"
    )
    assert "hloserve repo build" in str(info.value)


def test_front_does_not_import_jax() -> None:
    code = (
        "import sys; import hloserve.triton_backend.front.front_channel, "
        "hloserve.triton_backend.backends.pb; "
        "bad = [m for m in ('jax', 'jaxlib', 'triton_python_backend_utils') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_damaged_bundle_files_fail_the_front(tiny_bundle: Path) -> None:
    from hloserve.bundle.front_spec import check_bundle_files

    check_bundle_files("tiny", load_bundle(tiny_bundle))
    (tiny_bundle / "model.b4.mlirbc").write_bytes(b"ML\xefR damaged")
    with pytest.raises(InvalidArgumentError, match=r"model 'tiny': .*model\.b4\.mlirbc is not a"):
        check_bundle_files("tiny", load_bundle(tiny_bundle))


def test_damaged_weights_fail_the_front(tiny_bundle: Path) -> None:
    from hloserve.bundle.front_spec import check_bundle_files

    (tiny_bundle / "weights.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(InvalidArgumentError, match=r"model 'tiny': .*cannot read safetensors"):
        check_bundle_files("tiny", load_bundle(tiny_bundle))
    (tiny_bundle / "model.b1.mlirbc").unlink()
    with pytest.raises(InvalidArgumentError, match="cannot read executable"):
        check_bundle_files("tiny", load_bundle(tiny_bundle))


def test_the_shim_never_returns_a_request_without_a_response(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A None response makes Triton release the request unanswered (its client waits out its
    deadline): if the channel ever leaves one unanswered, ``execute`` fails it INTERNAL."""
    import importlib.util
    import types

    class TritonError:
        INTERNAL = "INTERNAL"

        def __init__(self, message: str, code: str) -> None:
            self.message, self.code = message, code

    class InferenceResponse:
        def __init__(self, output_tensors: Any = None, error: Any = None) -> None:
            self.output_tensors, self.error = output_tensors, error

    fake = types.SimpleNamespace(TritonError=TritonError, InferenceResponse=InferenceResponse)
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake)
    path = Path(hloserve.__file__).parent / "triton_backend/backends/hloserve_front/model.py"
    spec = importlib.util.spec_from_file_location("hloserve_front_shim", path)
    assert spec is not None and spec.loader is not None
    shim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shim)

    class Request:
        def inputs(self) -> list[Any]:
            return []

        def parameters(self) -> str:
            return "{}"

        def timeout(self) -> int:
            return 0

        def is_cancelled(self) -> bool:
            return False

    model = shim.TritonPythonModel()
    model._slots, model._stateful = None, False

    class Channel:
        core = types.SimpleNamespace(name="m")

        def run(self, items: list[Any]) -> None:  # answers the first request only
            model._respond(items[0].handle, Exception("first"))

    model.channel = Channel()
    responses = model.execute([Request(), Request(), Request()])
    assert [r.error.code for r in responses] == ["INTERNAL"] * 3
    assert responses[0].error.message.endswith("first")  # answered by the channel
    assert all("left without an answer" in r.error.message for r in responses[1:])


def test_a_stateful_front_takes_the_request_s_sequence_id(tmp_path: Path) -> None:
    """The correlation ID comes with the request (an int or a string, as Triton's clients send
    ``sequence_id``), not as a tensor; START and END are the control inputs; no ID is refused
    naming the model."""
    from hloserve.bundle.front_spec import FrontBundle
    from tests.accumulator_bundle import WIDTH, export_accumulator

    front = FrontModel("acc", FrontBundle.of(load_bundle(export_accumulator(tmp_path / "acc"))))
    assert front.stateful
    x = np.ones((1, WIDTH), np.float32)
    one, zero = np.ones((1, 1), np.int32), np.zeros((1, 1), np.int32)
    key = "6f1c2c5e-8f21-4f2a-9d55-8d8c7b5f3a11"
    prepared = front.prepare({"x": x, "START": one, "END": zero, "READY": one}, sequence_id=key)
    assert prepared.sequence == (key, True, False)
    assert set(prepared.inputs) == {"s", "x"}  # the state input, zeros: the runtime fills it
    prepared = front.prepare({"x": x, "START": zero, "END": one}, sequence_id=7)
    assert prepared.sequence == (7, False, True)
    for missing in (0, ""):
        with pytest.raises(InvalidArgumentError, match="model 'acc' is stateful: send each"):
            front.prepare({"x": x, "START": one}, sequence_id=missing)
