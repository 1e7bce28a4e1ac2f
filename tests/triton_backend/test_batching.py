"""Coalescing plan and array helpers (hloserve.triton_backend.batching): pure NumPy."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from hloserve.triton_backend.batching import (
    Execution,
    concatenate,
    pad,
    plan_executions,
    smallest_holding,
    split,
)


def _groups(plan: list[Execution]) -> list[tuple[tuple[int, ...], int]]:
    return [(e.requests, e.batch_size) for e in plan]


@pytest.mark.parametrize(
    ("sizes", "compiled", "expected"),
    [
        ([], [1, 8], []),
        ([1], [1, 8], [((0,), 1)]),
        ([5], [1, 8, 32], [((0,), 8)]),  # not compiled: padded to 8
        ([1] * 8, [1, 8], [((0, 1, 2, 3, 4, 5, 6, 7), 8)]),
        ([1] * 9, [1, 8], [(tuple(range(8)), 8), ((8,), 1)]),
        ([1, 3, 2, 1], [1, 4], [((0, 1), 4), ((2, 3), 4)]),
        ([3, 3, 3], [2, 4], [((0,), 4), ((1,), 4), ((2,), 4)]),  # never split a request
        ([2, 5, 1], [8], [((0, 1, 2), 8)]),
        ([8, 1], [1, 2, 8], [((0,), 8), ((1,), 1)]),
        ([4, 4, 1], [1, 2, 4, 8], [((0, 1), 8), ((2,), 1)]),
        ([1, 2], [4, 1, 2], [((0, 1), 4)]),  # compiled sizes in any order
        ([3], [3], [((0,), 3)]),
    ],
)
def test_plan_table(sizes: list[int], compiled: list[int], expected: list[object]) -> None:
    assert _groups(plan_executions(sizes, compiled)) == expected


def test_plan_offsets_and_sizes() -> None:
    plan = plan_executions([1, 3, 2, 1, 4], [1, 2, 4, 8])
    assert plan == [
        Execution(requests=(0, 1, 2, 3), offsets=(0, 1, 4, 6), sizes=(1, 3, 2, 1), batch_size=8),
        Execution(requests=(4,), offsets=(0,), sizes=(4,), batch_size=4),
    ]
    assert plan[0].items == 7 and plan[0].padding == 1
    assert plan[1].items == 4 and plan[1].padding == 0


@pytest.mark.parametrize(
    ("sizes", "compiled", "match"),
    [
        ([9], [1, 8], "request 0 has batch size 9"),
        ([1, 0], [1, 8], "request 1 has batch size 0"),
        ([1], [], "no compiled batch size"),
    ],
)
def test_plan_rejects(sizes: list[int], compiled: list[int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        plan_executions(sizes, compiled)


def test_plan_properties_on_random_inputs() -> None:
    """Invariants of the rule on 2,000 random cases (a table-free property check)."""
    rng = np.random.default_rng(0)
    for _ in range(2000):
        compiled = sorted(
            int(s) for s in rng.choice(np.arange(1, 40), size=rng.integers(1, 5), replace=False)
        )
        largest = compiled[-1]
        sizes = [int(s) for s in rng.integers(1, largest + 1, size=rng.integers(0, 30))]
        plan = plan_executions(sizes, compiled)
        flat = [i for e in plan for i in e.requests]
        assert flat == list(range(len(sizes)))  # whole requests, arrival order, each once
        for k, e in enumerate(plan):
            assert e.sizes == tuple(sizes[i] for i in e.requests)
            assert list(e.offsets) == list(np.cumsum((0, *e.sizes))[:-1])
            assert e.items <= largest
            assert e.batch_size in compiled
            assert e.batch_size == min(s for s in compiled if s >= e.items)  # smallest holding
            if k + 1 < len(plan):  # greedy: the next request did not fit
                assert e.items + sizes[plan[k + 1].requests[0]] > largest


def test_smallest_holding() -> None:
    assert smallest_holding(1, [1, 8]) == 1
    assert smallest_holding(2, [1, 8]) == 8
    assert smallest_holding(8, [1, 8]) == 8
    with pytest.raises(ValueError, match="exceed the largest compiled batch size 8"):
        smallest_holding(9, [1, 8])
    with pytest.raises(ValueError, match="at least 1"):
        smallest_holding(0, [1, 8])


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
