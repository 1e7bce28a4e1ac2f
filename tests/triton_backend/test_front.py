"""The front core (hloserve.triton_backend.front): coalescing, validation, retries, hooks.

Most tests wire the front to an in-process RuntimeModel (``call_runtime`` = ``runtime.execute``),
the same path the BLS shim takes minus Triton.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hloserve
from hloserve.bundle import load_bundle
from hloserve.errors import HloserveError, InvalidArgumentError, Status, UnavailableError
from hloserve.triton_backend.front import FrontModel, RetryPolicy, Tensors
from hloserve.triton_backend.pb import ModelArgs
from hloserve.triton_backend.runtime import RuntimeModel
from tests.conftest import GOLDEN
from tests.triton_backend.front_testing import Recorder, front_over
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
def runtime(paths: dict[str, Path]) -> RuntimeModel:
    return RuntimeModel(paths)


def _ok(result: Tensors | Exception) -> Tensors:
    assert not isinstance(result, Exception), result
    return result


def test_affine_requests_are_coalesced_and_padded(
    paths: dict[str, Path], runtime: RuntimeModel
) -> None:
    expected = np.load(GOLDEN / "affine.expected.npz")
    x, y, label = expected["x"], expected["y"], expected["label"]
    front, recorder = front_over("affine", paths, runtime)
    results = front.execute([{"x": x[:1]}, {"x": x[1:]}, {"x": x}])
    # compiled [1, 2]: (r0 + r1) at 2, then r2 at 2
    assert recorder.calls == [{"affine__x": (2, 4)}, {"affine__x": (2, 4)}]
    np.testing.assert_allclose(_ok(results[0])["y"], y[:1], rtol=1e-6)
    np.testing.assert_allclose(_ok(results[1])["y"], y[1:], rtol=1e-6)
    np.testing.assert_allclose(_ok(results[2])["y"], y, rtol=1e-6)
    assert _ok(results[2])["label"].tolist() == label.tolist()


def test_tiny_pads_three_single_requests_to_four(
    paths: dict[str, Path], runtime: RuntimeModel
) -> None:
    from tests.conftest import TINY_PARAMS

    front, recorder = front_over("tiny", paths, runtime)
    xs = [np.full((1, 4), i, np.float32) for i in range(3)]
    results = front.execute([{"x": x} for x in xs])
    assert recorder.calls == [{"tiny__x": (4, 4)}]
    for x, result in zip(xs, results, strict=True):
        out = _ok(result)
        np.testing.assert_allclose(out["y"], x @ TINY_PARAMS["w"] + TINY_PARAMS["b"], rtol=1e-6)
        np.testing.assert_allclose(out["s"], x.sum(axis=-1))


def test_bad_requests_fail_alone(paths: dict[str, Path], runtime: RuntimeModel) -> None:
    from tests.conftest import TINY_PARAMS

    front, recorder = front_over("tiny", paths, runtime)
    first = {"x": np.ones((2, 4), np.float32)}
    last = {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}  # unlike the first: order shows
    results = front.execute(
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
    assert recorder.calls == [{"tiny__x": (4, 4)}]  # the two good requests, together
    messages = [str(r) for r in results[1:8]]
    assert all(isinstance(r, InvalidArgumentError) for r in results[1:8]), results
    assert "model 'tiny': input 'x': expected dtype FP32 (f32), got FP64 (f64)" in messages[0]
    assert "expected shape [-1, 4], got [1, 3]" in messages[1]
    assert "missing input 'x'" in messages[2]
    assert "unknown input 'extra'" in messages[3]
    assert "batch size 5 is outside 1 to 4" in messages[4]
    assert "batch size 0 is outside 1 to 4" in messages[5]
    assert messages[6] == "unreadable tensor"
    for good, result in ((first, results[0]), (last, results[8])):  # the expected answers
        x = good["x"]
        np.testing.assert_allclose(
            _ok(result)["y"], x @ TINY_PARAMS["w"] + TINY_PARAMS["b"], rtol=1e-6
        )
        np.testing.assert_array_equal(_ok(result)["s"], x.sum(axis=-1))


def test_non_leading_batch_axis(paths: dict[str, Path], runtime: RuntimeModel) -> None:
    front, recorder = front_over("transposed", paths, runtime)
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(2, dtype=np.float32).reshape(2, 1) + 100
    results = front.execute([{"x": a}, {"x": b}, {"x": np.ones((2, 5), np.float32)}])
    assert recorder.calls == [{"transposed__x": (2, 4)}]  # 3 + 1 items, padded on axis 1
    for x, result in zip((a, b), results[:2], strict=True):
        out = _ok(result)
        np.testing.assert_array_equal(out["y"], x.T * TRANSPOSED_W)
        np.testing.assert_array_equal(out["z"], x + 1)
    assert isinstance(results[2], InvalidArgumentError)
    assert "batch size 5 is outside 1 to 4" in str(results[2])


def test_unbatched_runs_one_request_per_execution(
    paths: dict[str, Path], runtime: RuntimeModel
) -> None:
    front, recorder = front_over("unbatched", paths, runtime)
    xs = [np.array([1.0, 2.0, 3.0], np.float32), np.zeros(3, np.float32)]
    results = front.execute([{"x": x} for x in xs])
    assert recorder.calls == [{"unbatched__x": (3,)}, {"unbatched__x": (3,)}]
    for x, result in zip(xs, results, strict=True):
        np.testing.assert_array_equal(_ok(result)["y"], x * 2 + [1.0, 2.0, 3.0])


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def __call__(self) -> float:
        return self.now


Call = Callable[[Mapping[str, np.ndarray], Sequence[str]], Mapping[str, np.ndarray]]


@pytest.fixture
def make_front(tiny_bundle_src: Path) -> Callable[..., FrontModel]:
    """``make_front(call, clock, total_s=120)``: a ``tiny`` front over a fake runtime."""
    bundle = load_bundle(tiny_bundle_src)

    def make(call: Call, clock: FakeClock, total_s: float = 120.0) -> FrontModel:
        return FrontModel(
            "tiny",
            bundle,
            call,
            retry=RetryPolicy(total_s=total_s, first_delay_s=0.05, max_delay_s=0.2),
            sleep=clock.sleep,
            clock=clock,
        )

    return make


def _tiny_outputs(n: int) -> dict[str, np.ndarray]:
    return {"tiny__y": np.zeros((n, 3), np.float32), "tiny__s": np.zeros(n, np.float32)}


def test_retries_while_the_runtime_is_not_ready(make_front: Callable[..., FrontModel]) -> None:
    clock = FakeClock()
    attempts = []

    def call(inputs: Mapping[str, np.ndarray], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        attempts.append(clock.now)
        if len(attempts) < 5:
            raise HloserveError("Model 'hloserve_runtime' is not ready.", status=Status.UNAVAILABLE)
        return _tiny_outputs(1)

    [result] = make_front(call, clock).execute([{"x": np.zeros((1, 4), np.float32)}])
    assert _ok(result)["y"].shape == (1, 3)
    assert clock.sleeps == [0.05, 0.1, 0.2, 0.2]  # doubling, capped


def test_gives_up_after_the_total_wait(make_front: Callable[..., FrontModel]) -> None:
    clock = FakeClock()

    def call(inputs: Mapping[str, np.ndarray], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        raise HloserveError("is not ready", status=Status.UNAVAILABLE)

    [result] = make_front(call, clock, total_s=1.0).execute([{"x": np.zeros((1, 4), np.float32)}])
    assert isinstance(result, UnavailableError)
    assert "runtime model 'hloserve_runtime' still unavailable after 1 s" in str(result)
    assert sum(clock.sleeps) == pytest.approx(1.0)
    assert clock.now <= 1.0 + 1e-9


def test_runtime_errors_fail_only_their_execution(make_front: Callable[..., FrontModel]) -> None:
    clock = FakeClock()

    def call(inputs: Mapping[str, np.ndarray], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        x = inputs["tiny__x"]
        if (x < 0).any():
            raise HloserveError("boom", status=Status.INVALID_ARGUMENT)
        return _tiny_outputs(x.shape[0])

    front = make_front(call, clock)
    results = front.execute(
        [{"x": -np.ones((4, 4), np.float32)}, {"x": np.ones((4, 4), np.float32)}]
    )
    assert isinstance(results[0], HloserveError) and str(results[0]) == "boom"
    assert _ok(results[1])["y"].shape == (4, 3)
    assert clock.sleeps == []  # not UNAVAILABLE: no retry


def test_runtime_breaking_the_contract_is_internal(
    make_front: Callable[..., FrontModel],
) -> None:
    clock = FakeClock()

    def wrong_shape(inputs: Mapping[str, np.ndarray], outputs: Sequence[str]) -> Tensors:
        return {"tiny__y": np.zeros((1, 2), np.float32), "tiny__s": np.zeros(1, np.float32)}

    def missing(inputs: Mapping[str, np.ndarray], outputs: Sequence[str]) -> Tensors:
        return {"tiny__y": np.zeros((1, 3), np.float32)}

    def wrong_batch(inputs: Mapping[str, np.ndarray], outputs: Sequence[str]) -> Tensors:
        return _tiny_outputs(2)

    x = {"x": np.zeros((1, 4), np.float32)}
    for call, text in [
        (wrong_shape, "broke the contract"),
        (missing, "returned no output 'tiny__s'"),
        (wrong_batch, "returned batch size 2, expected 1"),
    ]:
        [result] = make_front(call, clock).execute([x])
        assert isinstance(result, HloserveError) and result.status is Status.INTERNAL
        assert text in str(result)


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


def test_hooks_wrap_each_request(paths: dict[str, Path], runtime: RuntimeModel) -> None:
    recorder = Recorder(runtime)
    front = FrontModel("tiny", load_bundle(paths["tiny"]), recorder, hooks=ScaleHooks())
    one = np.ones((1, 4), np.float32)
    results = front.execute([{"x": one}, {"x": -one}, {"x": np.zeros((1, 4), np.float32)}])
    out = _ok(results[0])
    np.testing.assert_array_equal(out["s"], [8.0])  # sum of 2 * ones(4)
    np.testing.assert_array_equal(out["twice_s"], [16.0])
    assert str(results[1]) == "preprocess refused"
    assert str(results[2]) == "postprocess refused"
    assert recorder.calls == [{"tiny__x": (4, 4)}]  # requests 0 and 2, padded to 4


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
        lambda i, o: {},
    )
    assert front.bundle.path == tiny_bundle_src and front.retry.total_s == 2.5
    assert front.runtime_model == "hloserve_runtime"
    with pytest.raises(InvalidArgumentError, match=r"lacks parameter 'hloserve\.bundle'"):
        FrontModel.from_args(_args(tmp_path), lambda i, o: {})
    with pytest.raises(InvalidArgumentError, match="repository format '9' is not supported"):
        FrontModel.from_args(
            _args(tmp_path, **{"hloserve.repository_format": "9", "hloserve.bundle": "x"}),
            lambda i, o: {},
        )
    with pytest.raises(InvalidArgumentError, match="must be a number of seconds"):
        FrontModel.from_args(
            _args(
                tiny_bundle_src.parent,
                **{"hloserve.bundle": "tiny", "hloserve.runtime_wait_s": "soon"},
            ),
            lambda i, o: {},
        )


def test_front_does_not_import_jax() -> None:
    code = (
        "import sys; import hloserve.triton_backend.front, hloserve.triton_backend.pb; "
        "bad = [m for m in ('jax', 'jaxlib', 'triton_python_backend_utils') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_damaged_bundle_files_fail_the_front(tiny_bundle: Path) -> None:
    from hloserve.triton_backend.front import check_bundle_files

    check_bundle_files("tiny", load_bundle(tiny_bundle))
    (tiny_bundle / "model.b4.mlirbc").write_bytes(b"ML\xefR damaged")
    with pytest.raises(InvalidArgumentError, match=r"model 'tiny': .*model\.b4\.mlirbc is not a"):
        check_bundle_files("tiny", load_bundle(tiny_bundle))


def test_damaged_weights_fail_the_front(tiny_bundle: Path) -> None:
    from hloserve.triton_backend.front import check_bundle_files

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

    model = shim.TritonPythonModel()
    model._slots = None

    class Channel:
        core = types.SimpleNamespace(name="m")

        def run(self, items: list[Any]) -> None:  # answers the first request only
            model._respond(items[0].handle, Exception("first"))

    model.channel = Channel()
    responses = model.execute([Request(), Request(), Request()])
    assert [r.error.code for r in responses] == ["INTERNAL"] * 3
    assert responses[0].error.message.endswith("first")  # answered by the channel
    assert all("left without an answer" in r.error.message for r in responses[1:])
