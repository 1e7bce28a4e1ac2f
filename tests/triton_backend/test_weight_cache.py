"""The weight cache policy (hloserve.triton_backend.runtime.weight_cache) with a fake transfer, no
JAX.

LRU order, pins, in-flight protection, accounting, over-budget models, compaction; plus the
memory-mapped safetensors reader and, once, the real JaxTransfer on the CPU device.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from hloserve.bundle.safetensors_file import mmap_tensors
from hloserve.errors import HloserveError, InvalidArgumentError, Status
from hloserve.triton_backend.runtime.residency import Residency
from hloserve.triton_backend.runtime.transfer import JaxTransfer, PackedJaxTransfer
from hloserve.triton_backend.runtime.weight_cache import WeightCache

KIB = 1024


class FakeSource:
    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.reads = 0

    def read(self) -> list[np.ndarray]:
        self.reads += 1
        return [np.zeros(self.nbytes, np.uint8)]


class FakeArray:
    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.deleted = False


class FakeTransfer:
    """Counts bytes on the 'device' and every copy; arrays are FakeArray."""

    def __init__(self) -> None:
        self.on_device = 0
        self.peak = 0
        self.to_host_calls = 0
        self.to_device_calls = 0

    def to_host(self, arrays: Sequence[np.ndarray], device: Any) -> list[Any]:
        self.to_host_calls += 1
        return [np.array(a) for a in arrays]

    def to_device(self, arrays: Sequence[Any], device: Any) -> list[Any]:
        self.to_device_calls += 1
        out = [FakeArray(int(a.nbytes)) for a in arrays]
        self.on_device += sum(a.nbytes for a in out)
        self.peak = max(self.peak, self.on_device)
        return out

    def delete(self, arrays: Sequence[Any]) -> None:
        for a in arrays:
            assert not a.deleted
            a.deleted = True
            self.on_device -= a.nbytes


class Events:
    def __init__(self) -> None:
        self.log: list[tuple[str, str, int]] = []

    def registered(self, name: str, nbytes: int, residency: str) -> None:
        self.log.append(("add", name, nbytes))

    def loaded(self, name: str, nbytes: int, seconds: float, resident_bytes: int) -> None:
        self.log.append(("load", name, resident_bytes))

    def evicted(self, name: str, nbytes: int, resident_bytes: int) -> None:
        self.log.append(("evict", name, resident_bytes))

    def removed(self, name: str, resident_bytes: int) -> None:
        self.log.append(("remove", name, resident_bytes))

    def resized(self, budget_bytes: int) -> None:
        self.log.append(("resize", "", budget_bytes))


def make(
    budget: int | None, sizes: dict[str, int], **kwargs: Any
) -> tuple[WeightCache, FakeTransfer, dict[str, FakeSource]]:
    transfer = FakeTransfer()
    cache = WeightCache(budget, transfer=transfer, **kwargs)
    sources = {}
    for name, nbytes in sizes.items():
        sources[name] = FakeSource(nbytes)
        cache.add_weights(name, sources[name], device=None)
    return cache, transfer, sources


def use(cache: WeightCache, name: str) -> None:
    cache.acquire(name)
    cache.release(name)


def test_lru_order_and_eviction() -> None:
    cache, transfer, _ = make(3 * KIB, {"a": KIB, "b": KIB, "c": KIB, "d": KIB})
    assert cache.resident_bytes == 0  # system: nothing on the device before first use
    for name in "abc":
        use(cache, name)
    assert cache.lru_order() == ["a", "b", "c"]
    use(cache, "a")  # bump a: b is now the oldest
    assert cache.lru_order() == ["b", "c", "a"]
    use(cache, "d")
    assert cache.lru_order() == ["c", "a", "d"]
    stats = cache.stats()
    assert stats.models["b"].evictions == 1 and not stats.models["b"].resident
    assert stats.resident_bytes == 3 * KIB == transfer.on_device
    assert transfer.peak <= 3 * KIB  # evicted (deleted) before the new load
    use(cache, "b")  # reload
    assert cache.stats().models["b"].loads == 2
    assert cache.stats().loads == 5 and cache.stats().evictions == 2


def test_resize_evicts_the_least_recently_used_until_the_weights_fit() -> None:
    events = Events()
    cache, transfer, _ = make(
        4 * KIB,
        {"a": KIB, "b": KIB, "c": KIB, "p": KIB},
        residency={"p": Residency.DEVICE},
        observer=events,
    )
    for name in "abc":
        use(cache, name)
    cache.acquire("c")  # in use: never evicted
    cache.resize(2 * KIB)  # p (pinned) and c fit: a then b go
    assert cache.lru_order() == ["c"] and transfer.on_device == 2 * KIB
    assert cache.budget_bytes == 2 * KIB and events.log[-1] == ("resize", "", 2 * KIB)
    cache.release("c")
    with pytest.raises(InvalidArgumentError, match="pinned"):
        cache.resize(KIB // 2)  # less than the pinned weights: refused, unchanged
    assert cache.budget_bytes == 2 * KIB


def test_resident_hit_does_not_transfer() -> None:
    cache, transfer, _ = make(2 * KIB, {"a": KIB})
    use(cache, "a")
    use(cache, "a")
    assert transfer.to_device_calls == 1
    stats = cache.stats().models["a"]
    assert stats.loads == 1 and stats.load_seconds >= 0 and stats.in_use == 0


def test_device_residency_is_loaded_at_add_never_evicted_and_counts_against_budget() -> None:
    cache, transfer, _ = make(
        3 * KIB, {"p": KIB, "a": KIB, "b": KIB, "c": KIB}, residency={"p": Residency.DEVICE}
    )
    assert cache.resident_bytes == KIB and cache.stats().models["p"].loads == 1
    assert cache.stats().pinned_bytes == KIB
    for _ in range(3):
        for name in "abcp":
            use(cache, name)
            assert cache.resident_bytes <= 3 * KIB
    stats = cache.stats()
    assert stats.models["p"].evictions == 0 and stats.models["p"].loads == 1
    assert "p" not in cache.lru_order()
    assert cache.pinned("p") and not cache.pinned("a") and not cache.pinned("unknown")
    assert sum(m.evictions for m in stats.models.values()) > 0
    assert transfer.peak <= 3 * KIB


def test_acquired_weights_are_never_evicted() -> None:
    cache, _, _ = make(2 * KIB, {"a": KIB, "b": KIB, "c": KIB}, wait_s=0.05)
    held = cache.acquire("a")  # oldest, but in flight
    use(cache, "b")
    use(cache, "c")  # must evict b, not a
    assert cache.lru_order() == ["a", "c"]
    assert cache.stats().models["a"].in_use == 1
    cache.acquire("c")  # now a and c are both in flight: b cannot fit
    with pytest.raises(HloserveError) as info:
        cache.acquire("b")
    assert info.value.status is Status.UNAVAILABLE
    assert "executing" in info.value.message
    cache.release("c")
    use(cache, "b")  # c is free again: evicted
    assert cache.lru_order() == ["a", "b"]
    assert held is cache.acquire("a")  # same arrays, no reload
    cache.release("a")
    cache.release("a")


def test_acquire_waits_for_a_release() -> None:
    cache, _, _ = make(KIB, {"a": KIB, "b": KIB}, wait_s=10)
    cache.acquire("a")
    timer = threading.Timer(0.05, cache.release, args=("a",))
    timer.start()
    start = time.monotonic()
    use(cache, "b")
    timer.join()
    assert 0.03 < time.monotonic() - start < 5
    assert cache.lru_order() == ["b"]


@pytest.mark.parametrize("residency", [Residency.SYSTEM, Residency.UNPINNED, Residency.DEVICE])
def test_model_larger_than_budget_fails_with_both_sizes(residency: Residency) -> None:
    cache, _, _ = make(3 * KIB, {"small": KIB}, residency={"big": residency})
    with pytest.raises(HloserveError) as info:
        cache.add_weights("big", FakeSource(4 * KIB), device=None)
    assert info.value.status is Status.INVALID_ARGUMENT
    message = info.value.message
    assert "'big'" in message and "4096 bytes" in message and "3072 bytes" in message
    use(cache, "small")  # the others keep serving
    with pytest.raises(HloserveError) as missing:
        cache.acquire("big")
    assert missing.value.status is Status.NOT_FOUND


def test_budget_left_by_pinned_models_is_what_counts() -> None:
    cache, _, _ = make(3 * KIB, {"p": 2 * KIB}, residency={"p": Residency.DEVICE})
    with pytest.raises(HloserveError) as info:
        cache.add_weights("a", FakeSource(2 * KIB), device=None)
    assert "pinned" in info.value.message and "2048 bytes" in info.value.message
    cache.add_weights("b", FakeSource(KIB), device=None)
    use(cache, "b")
    assert cache.resident_bytes == 3 * KIB


def test_tiers_system_reads_once_unpinned_reads_per_load() -> None:
    cache, transfer, sources = make(KIB, {"s": KIB, "u": KIB}, residency={"u": Residency.UNPINNED})
    assert sources["s"].reads == 1 and transfer.to_host_calls == 1  # host tier at add
    assert sources["u"].reads == 0
    for _ in range(3):
        use(cache, "s")
        use(cache, "u")
    assert sources["s"].reads == 1
    assert sources["u"].reads == 3
    assert cache.stats().models["u"].residency is Residency.UNPINNED


def test_no_budget_keeps_everything_resident() -> None:
    cache, transfer, _ = make(None, {"a": KIB, "b": 10 * KIB})
    assert cache.resident_bytes == 11 * KIB  # loaded at add, like the all-resident store
    assert transfer.to_host_calls == 0  # no host tier needed
    for _ in range(3):
        use(cache, "a")
        use(cache, "b")
    assert cache.stats().evictions == 0 and transfer.to_device_calls == 2
    assert WeightCache(0).budget_bytes is None


def test_remove_frees_device_and_duplicates_are_refused() -> None:
    cache, transfer, _ = make(2 * KIB, {"a": KIB})
    use(cache, "a")
    with pytest.raises(HloserveError) as info:
        cache.add_weights("a", FakeSource(KIB), device=None)
    assert info.value.status is Status.INTERNAL
    cache.remove("a")
    cache.remove("a")  # no-op
    assert transfer.on_device == 0 and cache.resident_bytes == 0
    with pytest.raises(HloserveError):
        cache.acquire("a")


def test_compaction_every_n_loads_frees_on_demand_only() -> None:
    cache, transfer, _ = make(
        4 * KIB,
        {"p": KIB, "a": KIB, "b": KIB, "c": KIB},
        residency={"p": Residency.DEVICE},
        compaction_interval=2,
    )
    use(cache, "a")
    use(cache, "b")
    assert cache.resident_bytes == 3 * KIB
    use(cache, "a")  # a hit, not a load: no compaction
    assert cache.stats().compactions == 0
    use(cache, "c")  # 2 loads since: compact first, then load c
    stats = cache.stats()
    assert stats.compactions == 1
    assert stats.resident_bytes == 2 * KIB and cache.lru_order() == ["c"]
    assert stats.models["p"].evictions == 0 and stats.models["a"].evictions == 1
    assert cache.compact() == KIB and cache.resident_bytes == KIB == transfer.on_device


def test_observer_sees_every_load_and_eviction_with_totals() -> None:
    events = Events()
    cache, _, _ = make(KIB, {"a": KIB, "b": KIB}, observer=events)
    use(cache, "a")
    use(cache, "b")
    assert events.log == [
        ("add", "a", KIB),
        ("add", "b", KIB),
        ("load", "a", KIB),
        ("evict", "a", 0),
        ("load", "b", KIB),
    ]
    cache.remove("b")  # its model unloaded: the metrics drop its series
    cache.remove("b")  # no-op, no event
    assert events.log[-1:] == [("remove", "b", 0)]


def test_concurrent_acquires_stay_within_budget() -> None:
    cache, transfer, _ = make(3 * KIB, {n: KIB for n in "abcdef"}, wait_s=10)
    rng = np.random.default_rng(3)
    plan = [[str(c) for c in rng.choice(list("abcdef"), 200)] for _ in range(4)]
    errors: list[BaseException] = []

    def client(names: list[str]) -> None:
        try:
            for name in names:
                cache.acquire(name)
                assert cache.resident_bytes <= 3 * KIB
                cache.release(name)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(p,)) for p in plan]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors
    assert transfer.peak <= 3 * KIB
    stats = cache.stats()
    assert all(m.in_use == 0 for m in stats.models.values())
    assert stats.loads - stats.evictions == len(cache.lru_order())


def test_bad_arguments() -> None:
    with pytest.raises(HloserveError):
        WeightCache(-1)
    with pytest.raises(HloserveError):
        WeightCache(1, compaction_interval=-1)
    with pytest.raises(HloserveError) as info:
        Residency.parse("gpu", model="m")
    assert "'m'" in info.value.message and "device" in info.value.message
    assert Residency.parse(" Device ") is Residency.DEVICE


def test_mmap_safetensors_matches_the_file(tmp_path: Path) -> None:
    import ml_dtypes
    from safetensors.numpy import save_file

    tensors = {
        "w": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b": np.array([1, -2], np.int64),
        "h": np.arange(5).astype(ml_dtypes.bfloat16),
    }
    path = tmp_path / "weights.safetensors"
    save_file(tensors, str(path))
    arrays = mmap_tensors(path, ["h", "w", "b"])
    for array, name in zip(arrays, ["h", "w", "b"], strict=True):
        assert array.dtype == tensors[name].dtype and array.shape == tensors[name].shape
        np.testing.assert_array_equal(array, tensors[name])
        assert not array.flags.writeable
    with pytest.raises(HloserveError) as info:
        mmap_tensors(path, ["w", "nope"])
    assert info.value.status is Status.NOT_FOUND


def test_jax_transfer_on_cpu_round_trips_and_deletes() -> None:
    import jax

    device = jax.devices("cpu")[0]
    transfer = JaxTransfer()
    source = [np.arange(6, dtype=np.float32).reshape(2, 3)]
    host = transfer.to_host(source, device)
    assert isinstance(host[0], np.ndarray) and host[0] is not source[0]
    placed = transfer.to_device(host, device)
    np.testing.assert_array_equal(np.asarray(placed[0]), source[0])
    transfer.delete(placed)
    assert placed[0].is_deleted()
    transfer.delete(placed)  # already deleted: no error


class FakeMetric:
    def __init__(self, family: FakeFamily, labels: dict[str, str], buckets: Any) -> None:
        self.family, self.labels, self.buckets = family, labels, buckets
        self.value = 0.0
        self.observed: list[float] = []

    def set(self, value: float) -> None:
        assert self.family.kind == "GAUGE"
        self.value = value

    def increment(self, value: float) -> None:
        assert self.family.kind == "COUNTER" and value >= 0
        self.value += value

    def observe(self, value: float) -> None:
        assert self.family.kind == "HISTOGRAM"
        self.observed.append(value)


class FakeFamily:
    COUNTER, GAUGE, HISTOGRAM = "COUNTER", "GAUGE", "HISTOGRAM"
    made: ClassVar[dict[str, FakeFamily]] = {}

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name, self.kind = name, kind
        self.metrics: list[FakeMetric] = []
        FakeFamily.made[name] = self

    def Metric(self, labels: dict[str, str], buckets: Any = None) -> FakeMetric:
        assert (buckets is not None) == (self.kind == "HISTOGRAM")
        self.metrics.append(FakeMetric(self, labels, buckets))
        return self.metrics[-1]


def test_triton_metrics_follow_the_cache() -> None:
    from types import SimpleNamespace

    from hloserve.triton_backend.backends.metrics import TritonCacheMetrics

    metrics = TritonCacheMetrics(SimpleNamespace(MetricFamily=FakeFamily), KIB, ["a", "b"])
    cache, _, _ = make(KIB, {"a": KIB, "b": KIB}, observer=metrics)
    use(cache, "a")
    use(cache, "b")

    def value(family: str, model: str | None = None) -> float:
        for m in FakeFamily.made[family].metrics:
            if m.labels.get("model") == model:
                return m.value
        raise KeyError(family)

    assert value("hloserve_weight_cache_budget_bytes") == KIB
    sizes = FakeFamily.made["hloserve_weight_bytes"].metrics
    assert [(m.labels, m.value) for m in sizes] == [
        ({"model": "a", "residency": "system"}, KIB),
        ({"model": "b", "residency": "system"}, KIB),
    ]
    assert value("hloserve_weight_cache_resident_bytes") == KIB
    assert value("hloserve_weight_resident_bytes", "a") == 0
    assert value("hloserve_weight_resident_bytes", "b") == KIB
    assert value("hloserve_weight_loads_total", "a") == 1
    assert value("hloserve_weight_evictions_total", "a") == 1
    assert value("hloserve_weight_evictions_total", "b") == 0
    histograms = FakeFamily.made["hloserve_weight_load_seconds"].metrics
    assert [len(h.observed) for h in histograms] == [1, 1]
    metrics.close()


def test_foreign_models_are_published_by_their_hint_outside_the_budget() -> None:
    """A foreign model's hint is its hloserve_weight_bytes (residency "foreign"), which the
    gateway's lpt_packing reads; the cache's budget and resident bytes do not count it."""
    from types import SimpleNamespace

    from hloserve.gateway.packing import weights_from_metrics
    from hloserve.triton_backend.backends.metrics import TritonCacheMetrics

    FakeFamily.made.clear()
    pb_utils = SimpleNamespace(MetricFamily=FakeFamily)
    metrics = TritonCacheMetrics(pb_utils, 2 * KIB, ["a"], {"onnx_m": 5 * KIB})
    sizes = FakeFamily.made["hloserve_weight_bytes"].metrics
    assert [(m.labels, m.value) for m in sizes] == [
        ({"model": "onnx_m", "residency": "foreign"}, 5 * KIB)
    ]
    cache, _, _ = make(2 * KIB, {"a": KIB}, observer=metrics)
    use(cache, "a")
    resident = FakeFamily.made["hloserve_weight_resident_bytes"].metrics
    assert [m.labels["model"] for m in resident] == ["a"]  # no cache series of its own
    total = FakeFamily.made["hloserve_weight_cache_resident_bytes"].metrics[0]
    assert total.value == KIB
    lines = []
    for family in FakeFamily.made.values():
        for m in family.metrics if family.kind == "GAUGE" else ():
            labels = ",".join(f'{k}="{v}"' for k, v in m.labels.items())
            lines.append(f"{family.name}{{{labels}}} {m.value}")
    info = weights_from_metrics({"w0": "\n".join(lines) + "\n"})
    assert dict(info.model_bytes) == {"a": KIB, "onnx_m": 5 * KIB}
    assert dict(info.budget_bytes) == {"w0": 2 * KIB}
    metrics.close()


def test_a_malformed_foreign_bytes_parameter_is_refused_naming_it() -> None:
    from hloserve.model_parameters import ModelArgs
    from hloserve.triton_backend.backends.metrics import foreign_bytes_from_args

    def args(value: str) -> ModelArgs:
        params = {"hloserve.foreign_memory_bytes": {"string_value": value}}
        return ModelArgs("hloserve_runtime", Path("."), "1", config={"parameters": params})

    assert foreign_bytes_from_args(args("m=10, n=0")) == {"m": 10, "n": 0}
    assert foreign_bytes_from_args(ModelArgs("hloserve_runtime", Path("."), "1")) == {}
    for bad, why in (("m=-1", "not an integer >= 0"), ("m", "not '<model>=<bytes>'"),
                     ("m=1,m=2", "given twice")):  # fmt: skip
        with pytest.raises(InvalidArgumentError) as info:
            foreign_bytes_from_args(args(bad))
        assert "'hloserve.foreign_memory_bytes'" in str(info.value) and why in str(info.value)
        assert info.value.status is Status.INVALID_ARGUMENT


PROMETHEUS_TEXT = """# HELP hloserve_weight_cache_budget_bytes Weight cache byte budget
# TYPE hloserve_weight_cache_budget_bytes gauge
hloserve_weight_cache_budget_bytes 2048
hloserve_weight_cache_resident_bytes 1024
hloserve_weight_bytes{model="a",residency="device"} 1024
hloserve_weight_bytes{model="b",residency="unpinned"} 3072
hloserve_weight_resident_bytes{model="a"} 1024
hloserve_weight_resident_bytes{model="b"} 0
hloserve_weight_loads_total{model="a"} 1
hloserve_weight_loads_total{model="b"} 4
hloserve_weight_evictions_total{model="b"} 3
hloserve_weight_load_seconds_bucket{model="b",le="0.01"} 4
hloserve_weight_load_seconds_sum{model="b"} 0.02
hloserve_weight_load_seconds_count{model="b"} 4
nv_inference_count{model="a",version="1"} 12
"""


def test_status_table_from_prometheus_text() -> None:
    from hloserve.node.status import render_status
    from hloserve.prometheus_text import cache_status

    status = cache_status(PROMETHEUS_TEXT)
    assert status.budget_bytes == 2048 and status.resident_bytes == KIB
    b = status.models["b"]
    assert (b.nbytes, b.residency, b.loads, b.evictions, b.load_seconds) == (
        3072,
        "unpinned",
        4,
        3,
        0.02,
    )
    table = render_status(status).splitlines()
    assert table[0] == "weight cache: budget 2.0 KiB, resident 1.0 KiB"
    assert table[1].split() == [
        "model",
        "residency",
        "weights",
        "resident",
        "loads",
        "evictions",
        "mean",
        "load",
    ]
    assert table[3].split() == ["b", "unpinned", "3.0", "KiB", "-", "4", "3", "5.00", "ms"]
    assert status.device == {}  # no device series (CPU): no device line
    assert not any(line.startswith("device memory") for line in table)
    device = cache_status(
        PROMETHEUS_TEXT
        + 'hloserve_device_memory_bytes{kind="limit"} 1073741824\n'
        + 'hloserve_device_memory_bytes{kind="scratch"} 2048\n'
    )
    assert device.device == {"limit": 1 << 30, "scratch": 2048}
    assert render_status(device).splitlines()[1] == "device memory: limit 1.0 GiB, scratch 2.0 KiB"
    with pytest.raises(HloserveError) as info:
        cache_status("nv_inference_count 1\n")
    assert info.value.status is Status.INVALID_ARGUMENT


def test_remove_while_in_use_does_not_delete_the_arrays_under_the_execution() -> None:
    cache, _, _ = make(2 * KIB, {"a": KIB})
    arrays = cache.acquire("a")
    cache.remove("a")
    assert not arrays[0].deleted and cache.resident_bytes == 0
    cache.release("a")  # unknown now: a no-op


class WaitSpy:
    """Stands in for the cache's release condition; ``waiting`` is set when a wait begins."""

    def __init__(self, condition: threading.Condition) -> None:
        self.condition = condition
        self.waiting = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting.set()
        return self.condition.wait(timeout)

    def notify_all(self) -> None:
        self.condition.notify_all()


def test_acquire_waiting_for_room_sees_a_removal(monkeypatch: pytest.MonkeyPatch) -> None:
    cache, transfer, _ = make(KIB, {"a": KIB, "b": KIB}, wait_s=10)
    spy = WaitSpy(cache._released)
    monkeypatch.setattr(cache, "_released", spy)
    cache.acquire("a")
    outcome: list[BaseException] = []

    def acquire_b() -> None:
        try:
            cache.acquire("b")
        except BaseException as exc:
            outcome.append(exc)

    acquiring = threading.Thread(target=acquire_b, daemon=True)
    acquiring.start()
    assert spy.waiting.wait(timeout=10), "acquire('b') never waited for room"
    assert acquiring.is_alive() and not outcome  # b cannot fit while a is in use
    cache.remove("b")
    cache.release("a")
    acquiring.join(timeout=10)
    assert not acquiring.is_alive(), "acquire('b') did not wake up for the removal"
    (error,) = outcome
    assert isinstance(error, HloserveError) and error.status is Status.NOT_FOUND
    assert "weights of model 'b' were removed" in str(error)  # seen after the wait
    assert transfer.to_device_calls == 1  # b was never loaded


@pytest.mark.usefixtures("restore_x64")
@pytest.mark.parametrize("chunk_bytes", [64, 1 << 20])
def test_packed_transfer_round_trips_every_dtype_on_cpu(chunk_bytes: int) -> None:
    import jax
    import ml_dtypes

    jax.config.update("jax_enable_x64", True)
    device = jax.devices("cpu")[0]
    rng = np.random.default_rng(7)
    arrays = [
        rng.standard_normal((3, 5)).astype(np.float32),
        rng.standard_normal(7).astype(ml_dtypes.bfloat16),
        rng.integers(-(2**40), 2**40, (2, 2)).astype(np.int64),
        np.array([True, False, True]),
        rng.integers(0, 255, 100).astype(np.uint8),
        rng.integers(-100, 100, 9).astype(np.int8),
        np.array(3.5, np.float16),  # a scalar
        np.zeros((0, 4), np.float32),  # empty
        rng.standard_normal(40).astype(np.float64),
    ]
    transfer = PackedJaxTransfer(chunk_bytes)
    host = transfer.to_host(arrays, device)
    assert len(host) == 1
    chunks = len(host[0].chunks)
    assert chunks > 1 if chunk_bytes == 64 else chunks == 1
    placed = transfer.to_device(host, device)
    for got, want in zip(placed, arrays, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(np.asarray(got), want)
    transfer.delete(placed)
    again = transfer.to_device(host, device)  # a reload from the same host tier
    np.testing.assert_array_equal(np.asarray(again[2]), arrays[2])
    plain = transfer.to_device(arrays[:1], device)  # unpacked arrays (unpinned): as JaxTransfer
    np.testing.assert_array_equal(np.asarray(plain[0]), arrays[0])


def test_cache_with_packed_transfer_serves_the_right_weights() -> None:
    import jax

    device = jax.devices("cpu")[0]
    cache = WeightCache(2 * KIB, transfer=PackedJaxTransfer(KIB))
    values = {n: np.full(KIB // 4, i, np.float32) for i, n in enumerate("abc")}

    class Source:
        def __init__(self, array: np.ndarray) -> None:
            self.array, self.nbytes = array, array.nbytes

        def read(self) -> list[np.ndarray]:
            return [self.array]

    for name, array in values.items():
        cache.add_weights(name, Source(array), device)
    for name in "abcabc":
        (weights,) = cache.acquire(name)
        np.testing.assert_array_equal(np.asarray(weights), values[name])
        cache.release(name)
    assert cache.stats().evictions > 0
