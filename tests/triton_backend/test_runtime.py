"""The runtime core (hloserve.triton_backend.runtime.core) in process: load, compile, run, errors.

Requests reach it as they do on a server: through a front over the channel
(tests/triton_backend/front_testing.py); loading and holding are driven directly.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hloserve.bundle import dtypes
from hloserve.errors import HloserveError, Status
from hloserve.model_parameters import ModelArgs
from hloserve.triton_backend.runtime.compile import compile_artifact
from hloserve.triton_backend.runtime.core import LoadedBundle, RuntimeModel
from hloserve.triton_backend.runtime.server import RuntimeServer
from hloserve.triton_backend.runtime.weight_cache import WeightCache
from tests.conftest import GOLDEN
from tests.triton_backend.front_testing import Front, front, ok, runtime_server
from tests.triton_backend.test_bundles import (
    EXECUTABLE_TOKENS,
    export_dtypes,
    extreme_values,
)

pytestmark = pytest.mark.usefixtures("restore_x64")


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runtime_bundles")
    broken = root / "broken"
    shutil.copytree(GOLDEN / "affine", broken)
    (broken / "model.b2.mlirbc").write_bytes(b"ML\xefR not a portable artifact")
    return {
        "affine": GOLDEN / "affine",
        "dtypes": export_dtypes(root / "dtypes"),
        "broken": broken,
        "missing": root / "no_such_bundle",
    }


class CountingCompile:
    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, artifact: bytes, device: Any, **kwargs: Any) -> Any:
        with self._lock:
            self.calls += 1
        return compile_artifact(artifact, device, **kwargs)


@pytest.fixture(scope="module")
def compiler() -> CountingCompile:
    return CountingCompile()


def _status(info: pytest.ExceptionInfo[HloserveError]) -> Status:
    return info.value.status


@pytest.fixture(scope="module")
def server() -> Iterator[RuntimeServer]:
    with runtime_server() as srv:
        yield srv


def test_affine_matches_golden_outputs(server: RuntimeServer) -> None:
    expected = np.load(GOLDEN / "affine.expected.npz")
    with front(server, "affine", GOLDEN / "affine") as f:
        [out, one] = map(ok, f.execute([{"x": expected["x"]}, {"x": expected["x"][:1]}]))
    assert set(out) == {"y", "label"}
    np.testing.assert_allclose(out["y"], expected["y"], rtol=1e-6)
    np.testing.assert_array_equal(out["label"], expected["label"])
    np.testing.assert_array_equal(one["label"], expected["label"][:1])


def test_bundle_is_loaded_once_under_concurrency(compiler: CountingCompile) -> None:
    runtime = RuntimeModel(compile=compiler)
    before = compiler.calls
    held: list[LoadedBundle] = []
    errors: list[BaseException] = []

    def hold() -> None:
        try:
            held.append(runtime.acquire("affine", GOLDEN / "affine"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=hold) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and len(held) == 6 and all(h is held[0] for h in held)
    assert compiler.calls - before == 2  # batch sizes 1 and 2, compiled once each
    assert held[0].load_seconds > 0
    [y, _] = runtime.run(held[0], 0, 2, [np.zeros((2, 4), np.float32)])
    assert np.asarray(y).shape == (2, 3)
    store = runtime.store
    assert isinstance(store, WeightCache) and store.budget_bytes is None
    assert store.stats().models["affine"].in_use == 0  # every execution's acquire released
    assert store.resident_bytes == (4 * 3 + 3) * 4
    runtime.close()
    assert store.resident_bytes == 0


def test_every_dtype_round_trips_bit_exactly(
    bundles: dict[str, Path], server: RuntimeServer
) -> None:
    inputs = {f"x_{t}": extreme_values(t, 4, seed=i) for i, t in enumerate(EXECUTABLE_TOKENS)}
    sent = {k: v.copy() for k, v in inputs.items()}
    with front(server, "dtypes", bundles["dtypes"]) as f:
        [result] = f.execute([inputs])
    out = ok(result)
    for array in inputs.values():  # outputs must not alias the request's memory
        array[...] = array[::-1]
    for t in EXECUTABLE_TOKENS:
        got = out[f"y_{t}"]
        want = sent[f"x_{t}"]
        assert got.dtype == dtypes.from_token(t).numpy, t
        assert got.tobytes() == want.tobytes(), t


def test_run_refuses_a_batch_size_without_an_executable() -> None:
    runtime = RuntimeModel()
    loaded = runtime.acquire("affine", GOLDEN / "affine")
    with pytest.raises(
        HloserveError,
        match=r"no executable for batch size 3; compiled batch "
        r"sizes \[1, 2\]",
    ) as info:
        runtime.run(loaded, 0, 3, [np.zeros((3, 4), np.float32)])
    assert _status(info) is Status.INVALID_ARGUMENT
    runtime.close()


def test_a_bundle_failing_to_load_leaves_others_serving(
    bundles: dict[str, Path], server: RuntimeServer
) -> None:
    runtime = server.core
    with pytest.raises(HloserveError, match="model 'broken' failed to load") as info:
        runtime.acquire("broken", bundles["broken"])
    assert _status(info) is Status.INVALID_ARGUMENT
    with pytest.raises(HloserveError, match=r"(?s)model 'missing' failed to load.*no manifest"):
        runtime.acquire("missing", bundles["missing"])  # the validator's error and status
    assert runtime.bundle_names == []  # a failed load holds nothing
    with pytest.raises(HloserveError, match="failed to load"):  # a front of it fails to load
        Front(server, "broken", bundles["broken"])
    with front(server, "affine", GOLDEN / "affine") as f:
        [result] = f.execute([{"x": np.zeros((1, 4), np.float32)}])
    assert ok(result)["y"].shape == (1, 3)


def test_load_error_names_the_model_not_the_copys_directory(tmp_path: Path) -> None:
    copy = tmp_path / "repo" / "digits_fast" / "1" / "bundle"  # the repository's layout
    shutil.copytree(GOLDEN / "affine", copy)
    (copy / "model.b2.mlirbc").unlink()
    runtime = RuntimeModel.from_args(_runtime_args(tmp_path, "2"))
    with pytest.raises(HloserveError) as info:
        runtime.acquire("digits_fast", copy)
    message = info.value.message
    assert message.startswith("model 'digits_fast' failed to load: bundle 'digits_fast' ("), message
    assert "'bundle'" not in message and "model.b2.mlirbc" in message
    assert runtime.bundle_names == []  # a failed load holds nothing


def _runtime_args(tmp_path: Path, fmt: str, **params: str) -> ModelArgs:
    parameters = {"hloserve.repository_format": {"string_value": fmt}}
    parameters.update({k: {"string_value": v} for k, v in params.items()})
    return ModelArgs(
        name="hloserve_runtime",
        model_dir=tmp_path / "repo" / "hloserve_runtime",
        version="1",
        config={"parameters": parameters},
    )


def test_from_args_lists_no_bundles_and_refuses_old_repositories(tmp_path: Path) -> None:
    runtime = RuntimeModel.from_args(_runtime_args(tmp_path, "2"))
    assert runtime.bundle_names == []
    with pytest.raises(HloserveError, match=r"no model 'c'; this runtime serves \[\]"):
        runtime.load("c")
    old = _runtime_args(tmp_path, "1", **{"hloserve.bundles": "a,b"})
    with pytest.raises(
        HloserveError, match=r"older hloserve.*rebuild it with `hloserve repo build`"
    ):
        RuntimeModel.from_args(old)
    with pytest.raises(HloserveError, match=r"repository format '1' is not supported.*rebuild"):
        RuntimeModel.from_args(_runtime_args(tmp_path, "1"))


def test_acquire_and_release_hold_by_reference_and_generation(tmp_path: Path) -> None:
    runtime = RuntimeModel()
    one = runtime.acquire("affine", GOLDEN / "affine")
    two = runtime.acquire("affine", GOLDEN / "affine")
    assert one is two and runtime.bundle_names == ["affine"]
    copy = tmp_path / "affine"
    shutil.copytree(GOLDEN / "affine", copy)
    newer = runtime.acquire("affine", copy)  # a reload's new instances: a new generation
    assert newer.key == "affine#2" and newer is not one
    assert not runtime.release(one.key)  # one holder left
    assert runtime.release(two.key)  # the last: unloaded, weights freed
    assert runtime.load("affine") is newer
    assert runtime.release(newer.key)
    assert runtime.bundle_names == []


def test_checker_names_the_tensors_that_disagree_on_batch_size() -> None:
    from hloserve.bundle.manifest_sections import TensorSpec
    from hloserve.errors import InvalidArgumentError
    from hloserve.triton_backend.front.tensors import TensorChecker

    check = TensorChecker(
        "m",
        "input",
        [
            TensorSpec(name="a", dtype="f32", shape="nk", dims={"k": 2}),
            TensorSpec(name="b", dtype="i64", shape="kn", dims={"k": 3}),
        ],
    )
    ok = {"a": np.zeros((4, 2), np.float32), "b": np.zeros((3, 4), np.int64)}
    assert check(ok) == 4
    bad = {"a": np.zeros((4, 2), np.float32), "b": np.zeros((3, 5), np.int64)}
    with pytest.raises(
        InvalidArgumentError, match="input 'b' has batch size 5 but input 'a' has 4"
    ):
        check(bad)
    with pytest.raises(
        InvalidArgumentError, match=r"input 'b': expected shape \[3, -1\], got \[4\]"
    ):
        check({"a": ok["a"], "b": np.zeros(4, np.int64)})
