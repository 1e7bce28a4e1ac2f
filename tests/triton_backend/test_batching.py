"""The array helpers of coalescing and variants (hloserve.triton_backend.channel.batching): pure
NumPy.

Which requests join an execution is the scheduler's rule (test_scheduler.py, ``coalescing``).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from hloserve.triton_backend.channel.batching import concatenate, pad, split


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_concatenate_pads_and_split_inverts_on_any_axis(axis: int) -> None:
    rng = np.random.default_rng(1)
    shapes = [[2, 3, 4], [2, 3, 4], [2, 3, 4]]
    counts = [1, 3, 2]
    parts = []
    for shape, n in zip(shapes, counts, strict=True):
        shape = list(shape)
        shape[axis] = n
        parts.append(rng.standard_normal(shape).astype(np.float32))
    whole = concatenate(parts, axis, 8)
    assert whole.shape[axis] == 8
    np.testing.assert_array_equal(
        np.take(whole, range(6), axis=axis), np.concatenate(parts, axis=axis)
    )
    assert not np.take(whole, [6, 7], axis=axis).any()  # zero padding
    back = split(whole, axis, counts)
    for got, want in zip(back, parts, strict=True):
        np.testing.assert_array_equal(got, want)


def test_concatenate_keeps_bits_of_every_dtype() -> None:
    for dtype in [np.bool_, np.uint8, np.int64, np.uint64, np.float16, ml_dtypes.bfloat16]:
        a = np.arange(6).reshape(3, 2).astype(dtype)
        b = np.ones((1, 2), dtype=dtype)
        out = concatenate([a, b], 0, 8)
        assert out.dtype == np.dtype(dtype)
        assert out[:3].tobytes() == a.tobytes() and out[3:4].tobytes() == b.tobytes()
        assert out[4:].tobytes() == bytes(out[4:].nbytes)  # padding is all-zero bytes


def test_single_array_that_fits_is_not_copied() -> None:
    a = np.zeros((4, 2), np.float32)
    assert concatenate([a], 0, 4) is a
    assert pad(a, 0, 4) is a
    assert pad(a, 0, 8).shape == (8, 2)


def test_concatenate_rejects_mismatches() -> None:
    a = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="dtypes"):
        concatenate([a, a.astype(np.float64)], 0, 8)
    with pytest.raises(ValueError, match="shapes"):
        concatenate([a, np.zeros((2, 4), np.float32)], 0, 8)
    with pytest.raises(ValueError, match="do not fit"):
        concatenate([a, a], 0, 3)
    with pytest.raises(ValueError, match="at least one"):
        concatenate([], 0, 3)
    with pytest.raises(ValueError, match="cannot pad"):
        pad(a, 0, 1)
    with pytest.raises(ValueError, match="exceed"):
        split(a, 0, [2, 1])


def test_split_returns_views_and_drops_padding() -> None:
    a = np.arange(10).reshape(2, 5)
    parts = split(a, 1, [1, 2])
    assert [p.shape for p in parts] == [(2, 1), (2, 2)]
    assert all(np.shares_memory(p, a) for p in parts)


def _documented_rule(rows: list[int], sizes: list[int]) -> list[tuple[int, ...]]:
    """docs/scheduling.md, "Coalescing", steps 1-3, for one model and variant: the works
    (indices) of each batch, and its batch size last."""
    queue = list(range(len(rows)))
    batches = []
    while queue:
        total = sum(rows[i] for i in queue)
        fitting = [s for s in sizes if s <= total]
        target = fitting[-1] if fitting else sizes[0]
        head = rows[queue[0]]
        if head > target:
            target = min(s for s in sizes if s >= head)
        taken, items = [], 0
        for i in queue:
            if items + rows[i] > target:
                break
            taken.append(i)
            items += rows[i]
        queue = queue[len(taken) :]
        batches.append((*taken, min(s for s in sizes if s >= items)))
    return batches


def test_the_scheduler_applies_the_documented_coalescing_rule() -> None:
    """The scheduler's batches equal docs/scheduling.md's three steps on 1,000 random cases
    (whole requests, arrival order, each once; docs/serving.md, "Coalescing rule")."""
    from hloserve.triton_backend.runtime.scheduler import Scheduler, SchedulerConfig, Work

    rng = np.random.default_rng(0)
    for _ in range(1000):
        sizes = sorted(
            int(s) for s in rng.choice(np.arange(1, 40), size=rng.integers(1, 5), replace=False)
        )
        rows = [int(r) for r in rng.integers(1, sizes[-1] + 1, size=rng.integers(1, 30))]
        scheduler = Scheduler(SchedulerConfig(discipline="fifo"), lambda w, r: None)
        scheduler.register("m", 0, sizes)
        for i, n in enumerate(rows):
            scheduler.submit(Work("m", 0, n, payload=i))
        got = []
        while (batch := scheduler.next(timeout=0)) is not None:
            got.append((*(w.payload for w in batch.works), batch.batch_size))
        assert got == _documented_rule(rows, sizes), (rows, sizes)
