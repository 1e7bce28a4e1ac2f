"""The runtime core with the weight cache on the CPU device: parameters, eviction, correctness.

Models ``m<i>``: ``y = x + sum(w)`` with ``w`` = WEIGHT_ITEMS f32 all equal to ``i + 1``, so
every answer tells which weights were used (``sum(w)`` is exact in f32).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hloserve import names
from hloserve.errors import HloserveError, Status
from hloserve.model_parameters import ModelArgs
from hloserve.triton_backend.runtime.core import RuntimeModel
from hloserve.triton_backend.runtime.residency import Residency
from hloserve.triton_backend.runtime.weight_cache import WeightCache

pytestmark = pytest.mark.usefixtures("restore_x64")

WEIGHT_ITEMS = 64 * 1024  # f32: 256 KiB per model
MODEL_BYTES = WEIGHT_ITEMS * 4


def weighted_fn(params: dict[str, Any], x: Any) -> Any:
    return x + params["w"].sum()


def export_weighted(out: Path, value: float, items: int = WEIGHT_ITEMS) -> Path:
    """A bundle ``y = x + sum(w)`` (x, y f32 ``nk`` k=4; batch size 1), ``w`` all ``value``."""
    from hloserve.export import OutputSpec, TensorSpec, export_bundle

    export_bundle(
        weighted_fn,
        {"w": np.full(items, value, np.float32)},
        [TensorSpec(name="x", dtype="f32", shape="nk", dims={"k": 4})],
        [OutputSpec("y", "nk")],
        [1],
        out,
    )
    return out


def expected_y(x: np.ndarray, value: float, items: int = WEIGHT_ITEMS) -> np.ndarray:
    return x + np.float32(value * items)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository-shaped tree: ``<repo>/m<i>/1/bundle`` for i < 4, plus ``huge`` (4 models)."""
    root = tmp_path_factory.mktemp("cache_runtime")
    for i in range(4):
        export_weighted(root / f"m{i}" / names.BUNDLE_SUBDIR, i + 1)
    export_weighted(root / "huge" / names.BUNDLE_SUBDIR, 7, items=4 * WEIGHT_ITEMS)
    return root


def _args(repo: Path, bundles: list[str], **params: str) -> ModelArgs:
    """The runtime's args (repository format 2: no bundle list; ``bundles`` are loaded by
    :func:`_load`, as the fronts would)."""
    values = {names.PARAM_REPOSITORY_FORMAT: str(names.REPOSITORY_FORMAT), **params}
    return ModelArgs(
        name=names.RUNTIME_MODEL,
        model_dir=repo / names.RUNTIME_MODEL,
        version="1",
        config={"parameters": {k: {"string_value": v} for k, v in values.items()}},
    )


def _load(runtime: RuntimeModel, repo: Path, bundles: list[str]) -> dict[str, HloserveError]:
    """Each bundle acquired as its front would, pinned ones first; the errors by name."""
    failed = {}
    for name in sorted(bundles, key=lambda n: (not runtime.store.pinned(n), n)):
        try:
            runtime.acquire(name, repo / name / names.BUNDLE_SUBDIR)
        except HloserveError as exc:
            failed[name] = exc
    return failed


def test_budget_and_residency_from_parameters_serve_correctly(repo: Path) -> None:
    models = ["m0", "m1", "m2", "m3", "huge"]
    events: list[tuple[str, str]] = []

    class Observer:
        def registered(self, name: str, nbytes: int, residency: str) -> None:
            events.append(("add", name))

        def loaded(self, name: str, nbytes: int, seconds: float, resident: int) -> None:
            events.append(("load", name))
            assert resident <= 3 * MODEL_BYTES

        def evicted(self, name: str, nbytes: int, resident: int) -> None:
            events.append(("evict", name))

        def removed(self, name: str, resident: int) -> None:
            events.append(("remove", name))

    budgets: list[int | None] = []

    def observer(budget: int | None, names_: Any) -> Observer:
        budgets.append(budget)
        assert set(names_) <= set(models)  # the runtime knows the models with a residency
        return Observer()

    params = {
        names.PARAM_WEIGHT_CACHE_BYTES: str(3 * MODEL_BYTES),
        names.PARAM_RESIDENCY: "m0=device,m3=unpinned",
    }
    runtime = RuntimeModel.from_args(_args(repo, models, **params), observer=observer)
    assert budgets == [3 * MODEL_BYTES]
    cache = runtime.store
    assert isinstance(cache, WeightCache)
    failed = _load(runtime, repo, models)
    assert set(failed) == {"huge"}
    message = failed["huge"].message
    assert failed["huge"].status is Status.INVALID_ARGUMENT
    assert str(4 * MODEL_BYTES) in message and str(3 * MODEL_BYTES) in message, message
    assert f"{MODEL_BYTES} bytes) of it pinned" in message  # m0 (device) was loaded first
    rng = np.random.default_rng(5)
    for _ in range(40):
        i = int(rng.integers(0, 4))
        x = rng.integers(-8, 8, (1, 4)).astype(np.float32)
        y = np.asarray(runtime.run(runtime.load(f"m{i}"), 0, 1, [x])[0])
        np.testing.assert_array_equal(y, expected_y(x, i + 1))
        assert cache.resident_bytes <= 3 * MODEL_BYTES
    stats = cache.stats()
    assert stats.models["m0"].residency is Residency.DEVICE
    assert stats.models["m0"].evictions == 0 and stats.models["m0"].loads == 1
    assert stats.models["m3"].residency is Residency.UNPINNED
    assert stats.evictions > 0 and stats.loads > 4
    assert ("evict", "m0") not in events
    with pytest.raises(HloserveError) as info:
        runtime.load("huge")
    assert info.value.status is Status.NOT_FOUND  # its load failed: nothing holds it
    runtime.close()
    assert cache.resident_bytes == 0


def test_no_budget_keeps_every_model_resident(repo: Path) -> None:
    runtime = RuntimeModel.from_args(_args(repo, ["m0", "m1"]))
    assert _load(runtime, repo, ["m0", "m1"]) == {}
    cache = runtime.store
    assert isinstance(cache, WeightCache) and cache.budget_bytes is None
    assert cache.resident_bytes == 2 * MODEL_BYTES
    x = np.ones((1, 4), np.float32)
    np.testing.assert_array_equal(
        np.asarray(runtime.run(runtime.load("m1"), 0, 1, [x])[0]), expected_y(x, 2)
    )
    runtime.close()


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({names.PARAM_WEIGHT_CACHE_BYTES: "lots"}, "non-negative integer"),
        ({names.PARAM_COMPACTION_INTERVAL: "-1"}, "non-negative integer"),
        ({names.PARAM_RESIDENCY: "m0=gpu"}, "'gpu'"),
    ],
)
def test_bad_parameters_are_refused(repo: Path, params: dict[str, str], needle: str) -> None:
    with pytest.raises(HloserveError) as info:
        RuntimeModel.from_args(_args(repo, ["m0"], **params))
    assert info.value.status is Status.INVALID_ARGUMENT
    assert needle in info.value.message


def test_residency_values_match_the_repository_names() -> None:
    assert tuple(r.value for r in Residency) == names.RESIDENCIES


class FakeDevice:
    def __init__(self, stats: dict[str, int] | None) -> None:
        self.stats = stats

    def memory_stats(self) -> dict[str, int] | None:
        return self.stats

    def __str__(self) -> str:
        return "FakeDevice"


def test_budget_as_a_fraction_of_free_device_memory(repo: Path) -> None:
    from hloserve.triton_backend.runtime.config import weight_cache_from_args

    args = _args(repo, ["m0"], **{names.PARAM_WEIGHT_CACHE_FRACTION: "0.5"})
    device = FakeDevice({"bytes_limit": 10_000, "bytes_in_use": 2_000})
    assert weight_cache_from_args(args, {"m0"}, device=device).budget_bytes == 4_000
    # no memory statistics (the CPU device): no budget
    assert weight_cache_from_args(args, {"m0"}, device=FakeDevice(None)).budget_bytes is None
    runtime = RuntimeModel.from_args(args)  # JAX's CPU device
    assert isinstance(runtime.store, WeightCache) and runtime.store.budget_bytes is None


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({names.PARAM_WEIGHT_CACHE_FRACTION: "1.5"}, "(0, 1]"),
        ({names.PARAM_WEIGHT_CACHE_FRACTION: "half"}, "(0, 1]"),
        (
            {names.PARAM_WEIGHT_CACHE_FRACTION: "0.5", names.PARAM_WEIGHT_CACHE_BYTES: "10"},
            "keep one",
        ),
    ],
)
def test_bad_fraction_is_refused(repo: Path, params: dict[str, str], needle: str) -> None:
    from hloserve.triton_backend.runtime.config import weight_cache_from_args

    with pytest.raises(HloserveError) as info:
        weight_cache_from_args(_args(repo, ["m0"], **params), {"m0"}, device=FakeDevice(None))
    assert info.value.status is Status.INVALID_ARGUMENT and needle in info.value.message
