"""GPU check of on-demand weights: the runtime core's WeightCache against bare JAX transfers.

    python benchmarks/gpu_weight_cache.py                 # 1 GiB model, on the first device
    python benchmarks/gpu_weight_cache.py --bytes 4MiB    # a quick run (CPU too)
    python benchmarks/gpu_weight_cache.py --tensors 256   # per-transfer overhead (~70-80 us)
    python benchmarks/gpu_weight_cache.py --tensors 256 --packed 64MiB   # ... packed

For the GPU machine (Python 3.12, JAX 0.11.2, numpy 2.5, no Triton): run from the repository
root; it needs only numpy, JAX and ``hloserve/`` (put on ``sys.path`` from here; the weight cache
imports nothing else). It measures, for one model of ``--bytes`` of f32 weights in
``--tensors`` arrays:

(a) a cold load by the cache (:class:`WeightCache` with :class:`JaxTransfer`, or with
    :class:`PackedJaxTransfer` given ``--packed CHUNK``; residency
    ``system``: the host tier is in the ``pinned_host`` memory kind on a GPU) -- the model is
    evicted between repetitions;
(b) a bare ``jax.device_put`` of the same arrays from ``pinned_host`` memory;
(c) a bare ``jax.device_put`` of the same arrays from pageable NumPy memory;

then device memory (``Device.memory_stats()["bytes_in_use"]``) before the load (host tier in
place), loaded, and after eviction, which must be back at the pre-load level. Prints median
seconds, GB/s and the ratios a/b (goal <= 1.2, docs/on_demand_weights.md) and c/b (``--json
PATH`` also writes them there). Exit status 1 when ``--check`` is given and the ratio or the
memory check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_UNITS = {"": 1, "B": 1, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "KB": 10**3, "MB": 10**6}
_UNITS["GB"] = 10**9


def parse_bytes(text: str) -> int:
    """``"1GiB"``, ``"512MiB"``, ``"4096"`` -> bytes."""
    t = text.strip().upper()
    digits = t.rstrip("KMGIB")
    unit = t[len(digits) :]
    if unit not in _UNITS or not digits:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 1GiB, 64MiB, 4096)")
    return int(float(digits) * _UNITS[unit])


class ArraySource:
    """A :class:`WeightSource` over arrays already in memory."""

    def __init__(self, arrays: Sequence[np.ndarray]) -> None:
        self.arrays = list(arrays)
        self.nbytes = sum(int(a.nbytes) for a in self.arrays)

    def read(self) -> list[np.ndarray]:
        return self.arrays


def in_use(device: Any) -> int | None:
    """Device bytes in use, or None where the backend keeps no statistics (CPU)."""
    stats = device.memory_stats()
    return None if not stats else int(stats.get("bytes_in_use", 0))


#: Goal for ratio a/b: a cold load by the cache at most 20% slower than a bare ``device_put`` of
#: the same arrays from pinned host memory (docs/on_demand_weights.md, "Checks").
RATIO_GOAL = 1.2


def back_to_pre_load(pre_load: int, evicted: int, nbytes: int) -> bool:
    """Whether device bytes in use after eviction are back at the pre-load level.

    The pre-load level is taken with the host tier in place (pinned host memory may or may not
    be counted in the device's statistics) and before the device load; the tolerance is 1 MiB
    or 0.1% of the model's ``nbytes``, whichever is larger (allocator granularity).
    """
    return abs(evicted - pre_load) <= max(2**20, nbytes // 1000)


def verdict(ratio: float, *, pinned_tier: bool, memory_back: bool | None) -> bool:
    """PASS (True) or MISSED a goal (False).

    Args:
        ratio: median cold load by the cache / median bare ``device_put`` from pinned memory.
        pinned_tier: whether the device has a ``pinned_host`` memory kind; without one (CPU) the
            ratio goal is not checked.
        memory_back: :func:`back_to_pre_load`, or None where the device keeps no memory
            statistics (not checked).
    """
    ratio_ok = ratio <= RATIO_GOAL or not pinned_tier
    return ratio_ok and memory_back is not False


def timed_interleaved(
    runs: Sequence[tuple[Callable[[], Any], Callable[[Any], None]]], repeats: int
) -> list[list[float]]:
    """Seconds per repetition of each ``run()``, the runs taking turns (one warm-up round);
    each ``cleanup(result)`` is untimed."""
    seconds: list[list[float]] = [[] for _ in runs]
    for round_ in range(repeats + 1):
        for (run, cleanup), out in zip(runs, seconds, strict=True):
            start = time.perf_counter()
            result = run()
            if round_:
                out.append(time.perf_counter() - start)
            cleanup(result)
    return seconds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bytes", type=parse_bytes, default=2**30, help="model size (1GiB)")
    parser.add_argument("--tensors", type=int, default=1, help="weight arrays (1)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repetitions (5)")
    parser.add_argument("--platform", default=None, help="JAX platform (default: JAX's first)")
    parser.add_argument(
        "--packed",
        type=parse_bytes,
        default=0,
        metavar="CHUNK",
        help="(a) with PackedJaxTransfer: weights packed in host chunks of CHUNK bytes, one "
        "transfer per chunk, split on the device (default: JaxTransfer, one per array)",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if a goal is missed")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="results as JSON")
    args = parser.parse_args(argv)
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

    import jax
    from jax.sharding import SingleDeviceSharding

    from hloserve.triton_backend.runtime.transfer import (
        JaxTransfer,
        PackedJaxTransfer,
        memory_sharding,
    )
    from hloserve.triton_backend.runtime.weight_cache import WeightCache

    device = jax.devices(args.platform)[0] if args.platform else jax.devices()[0]
    items = args.bytes // 4 // args.tensors
    rng = np.random.default_rng(0)
    pageable = [rng.standard_normal(items, dtype=np.float32) for _ in range(args.tensors)]
    nbytes = sum(a.nbytes for a in pageable)
    print(
        f"device {device.device_kind} ({device.platform}), jax {jax.__version__}, "
        f"numpy {np.__version__}; model {nbytes / 2**20:.1f} MiB in {args.tensors} array(s)"
    )
    pinned_kind = memory_sharding(device, "pinned_host")
    target = memory_sharding(device, None) or SingleDeviceSharding(device)
    print(f"host tier: {'pinned_host' if pinned_kind is not None else 'pageable numpy'}")

    def delete(arrays: Sequence[Any]) -> None:
        for a in arrays:
            a.delete()

    def put(host: Sequence[Any]) -> Callable[[], list[Any]]:
        def run() -> list[Any]:
            placed = list(jax.device_put(list(host), target))
            jax.block_until_ready(placed)
            return placed

        return run

    # (a) the cache: cold loads from the host tier, evicted between repetitions
    before = in_use(device)
    transfer = PackedJaxTransfer(args.packed) if args.packed else JaxTransfer()
    cache = WeightCache(2 * nbytes, transfer=transfer)
    cache.add_weights("model", ArraySource(pageable), device)
    after_host = in_use(device)

    def load() -> None:
        cache.acquire("model")
        cache.release("model")

    load()
    loaded = in_use(device)
    cache.compact()
    evicted = in_use(device)

    # (b) bare device_put from pinned host memory, (c) from pageable memory
    pinned = pageable
    if pinned_kind is not None:
        pinned = list(jax.device_put(pageable, pinned_kind))
        jax.block_until_ready(pinned)
    runs: list[tuple[Callable[[], Any], Callable[[Any], None]]] = [
        (load, lambda _: cache.compact()),
        (put(pinned), delete),
        (put(pageable), delete),
    ]
    cache_s, pinned_s, pageable_s = timed_interleaved(runs, args.repeats)
    cache.remove("model")
    if pinned is not pageable:
        delete(pinned)

    packed = f", packed {args.packed / 2**20:g} MiB" if args.packed else ""
    rows = [(f"(a) cache cold load{packed}", cache_s), ("(b) device_put pinned", pinned_s)]
    rows.append(("(c) device_put pageable", pageable_s))
    result: dict[str, Any] = {
        "device": f"{device.device_kind} ({device.platform})",
        "jax": jax.__version__,
        "model_bytes": nbytes,
        "tensors": args.tensors,
        "packed_chunk_bytes": args.packed,
        "host_tier": "pinned_host" if pinned_kind is not None else "pageable numpy",
    }
    for (label, seconds), key in zip(rows, ("cache", "pinned", "pageable"), strict=True):
        median = statistics.median(seconds)
        print(f"{label:26s} median {median * 1e3:9.2f} ms  {nbytes / median / 1e9:7.2f} GB/s")
        result[f"{key}_median_s"] = median
        result[f"{key}_gb_s"] = nbytes / median / 1e9
    ratio = statistics.median(cache_s) / statistics.median(pinned_s)
    pageable_ratio = statistics.median(pageable_s) / statistics.median(pinned_s)
    goal = (
        f"goal <= {RATIO_GOAL}"
        if pinned_kind is not None
        else "no pinned tier here: goal not checked"
    )
    print(f"ratio a/b ({goal}): {ratio:.2f}")
    print(f"ratio c/b: {pageable_ratio:.2f}")
    back = None
    if before is None:
        print("device memory: no memory_stats on this device (CPU); not checked")
    else:
        assert after_host is not None and loaded is not None and evicted is not None
        back = back_to_pre_load(after_host, evicted, nbytes)
        print(
            f"device memory bytes_in_use: before the host tier {before}, pre-load {after_host}, "
            f"loaded {loaded} (+{loaded - after_host}), after eviction {evicted} "
            f"({'back to the pre-load level' if back else 'NOT back to the pre-load level'})"
        )
    ok = verdict(ratio, pinned_tier=pinned_kind is not None, memory_back=back)
    print("PASS" if ok else "MISSED a goal")
    if args.json is not None:
        memory = dict(before=before, pre_load=after_host, loaded=loaded, evicted=evicted)
        result |= {
            "ratio_cache_to_pinned": ratio,
            "ratio_goal": RATIO_GOAL if pinned_kind is not None else None,
            "ratio_pageable_to_pinned": pageable_ratio,
            "device_bytes_in_use": memory if before is not None else None,
            "memory_back_after_eviction": back,
            "pass": ok,
        }
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
