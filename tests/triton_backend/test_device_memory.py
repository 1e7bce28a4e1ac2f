"""The runtime owns its device memory (docs/on_demand_weights.md, "Device memory"): JAX's
allocator settings, the weight budget sized from the card (on by default where the device
reports memory statistics), refusals naming the numbers, and the published figures.

``memory_stats()`` is faked only at JAX's device: ``HLOSERVE_FAKE_MEMORY_STATS`` names a JSON
file the runtime reads instead of asking the device. Fronts and the runtime talk over the real
channel (no Triton).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hloserve import names
from hloserve.bundle.bundle import load_bundle
from hloserve.errors import HloserveError, Status
from hloserve.metric_names import DEVICE_MEMORY_KINDS
from hloserve.model_parameters import ModelArgs
from hloserve.triton_backend.front.core import FrontModel
from hloserve.triton_backend.front.front_channel import ChannelFront, Request
from hloserve.triton_backend.runtime.config import device_memory_from_args
from hloserve.triton_backend.runtime.core import RuntimeModel
from hloserve.triton_backend.runtime.device_memory import (
    FAKE_STATS_ENV,
    MARGIN,
    allocator_environment,
    executable_memory,
)
from hloserve.triton_backend.runtime.server import RuntimeServer, RuntimeState
from hloserve.units import format_size
from tests.conftest import GOLDEN, needs_tritonclient

pytestmark = pytest.mark.usefixtures("restore_x64")

#: the faked card: the allocator's limit, in use, peak (bytes)
LIMIT, IN_USE, PEAK = 1 << 30, 300 << 20, 400 << 20
AFFINE_WEIGHT_BYTES = load_bundle(GOLDEN / "affine").weight_nbytes


def _args(**params: str) -> ModelArgs:
    values = {names.PARAM_REPOSITORY_FORMAT: str(names.REPOSITORY_FORMAT), **params}
    return ModelArgs(
        name=names.RUNTIME_MODEL,
        model_dir=Path("/nonexistent") / names.RUNTIME_MODEL,
        version="1",
        config={"parameters": {k: {"string_value": v} for k, v in values.items()}},
    )


def _fake(path: Path, monkeypatch: pytest.MonkeyPatch, limit: int = LIMIT) -> None:
    stats = {"bytes_limit": limit, "bytes_in_use": IN_USE, "peak_bytes_in_use": PEAK}
    path.write_text(json.dumps(stats))
    monkeypatch.setenv(FAKE_STATS_ENV, str(path))


class Runtime:
    """A runtime built from its config parameters as the shim builds it, and its states."""

    def __init__(self, **params: str) -> None:
        args = _args(**params)
        self.core = RuntimeModel.from_args(args)
        self.states: list[RuntimeState] = []
        self.key = f"{os.getpid()}-{os.stat('/proc/self/ns/pid').st_ino}"
        self.server = RuntimeServer(
            self.core,
            address=f"\0hloserve.channel-test-{uuid.uuid4().hex}",
            publish_state=self.states.append,
            flush_interval_s=0.05,
            key=self.key,
            memory=device_memory_from_args(args, self.core.device, self.core.store),
        )
        self.server.start()

    def front(self) -> ChannelFront:
        core = FrontModel("affine", load_bundle(GOLDEN / "affine"))
        answers: dict[Any, Any] = {}
        f = ChannelFront(
            core,
            GOLDEN / "affine",
            lambda h, r: answers.__setitem__(h, r),
            address=self.server.address,
            key=self.key,
            inline=True,
        )
        f.start(wait_s=60)
        f.answers = answers  # type: ignore[attr-defined]
        return f

    def memory(self) -> dict[str, int] | None:
        """The figures of a state published after now."""
        count = len(self.states)
        end = time.monotonic() + 10
        while len(self.states) <= count + 1:
            assert time.monotonic() < end
            time.sleep(0.02)
        return self.states[-1].memory

    def close(self) -> None:
        self.server.close()
        self.core.close()


@pytest.fixture
def runtimes() -> Iterator[list[Runtime]]:
    made: list[Runtime] = []
    yield made
    for runtime in made:
        runtime.close()


def test_the_allocator_is_set_without_preallocation_and_with_one_fraction_variable() -> None:
    env = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.75"}  # jaxlib refuses both names set at once
    allocator_environment(0.0, env)
    assert env == {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_CLIENT_MEM_FRACTION": "0.9"}
    allocator_environment(0.6, env)
    assert env["XLA_CLIENT_MEM_FRACTION"] == "0.6"


def test_the_budget_is_on_by_default_sized_from_the_card_and_the_gauges_are_its_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runtimes: list[Runtime]
) -> None:
    _fake(tmp_path / "stats.json", monkeypatch)
    runtime = Runtime()  # no --weight-cache-bytes: the behaviour change, a budget from the card
    runtimes.append(runtime)
    assert runtime.core.store.budget_bytes == int(LIMIT * (1 - MARGIN))
    before = runtime.memory()
    assert before is not None and before["weights"] == 0
    f = runtime.front()
    try:
        f.run([Request("r", {"x": np.ones((1, 4), np.float32)})])
        assert not isinstance(f.answers["r"], Exception), f.answers  # type: ignore[attr-defined]
        after = runtime.memory()
    finally:
        f.close()
    bundle = runtime.core.acquire("affine", GOLDEN / "affine")
    try:
        scratch = max(executable_memory(e.loaded)[1] for e in bundle.executables.values())
        code = sum(executable_memory(e.loaded)[0] for e in bundle.executables.values())
    finally:
        runtime.core.release(bundle.key)
    assert after is not None
    margin = int(MARGIN * LIMIT)
    assert after == {
        "total": int(LIMIT / names.DEFAULT_DEVICE_MEMORY_FRACTION),
        "limit": LIMIT,
        "in_use": IN_USE,
        "peak": PEAK,
        "weights": AFFINE_WEIGHT_BYTES,
        "executables": code,
        "scratch": scratch,
        "headroom": LIMIT - IN_USE,
        "budget": LIMIT - code - scratch - margin,
    }
    assert after["weights"] - before["weights"] == AFFINE_WEIGHT_BYTES
    assert scratch > 0  # XLA's analysis reached the figures


def test_a_budget_larger_than_the_card_is_refused_at_load_naming_the_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runtimes: list[Runtime]
) -> None:
    _fake(tmp_path / "stats.json", monkeypatch)
    runtime = Runtime(**{names.PARAM_WEIGHT_CACHE_BYTES: str(2 * LIMIT)})
    runtimes.append(runtime)
    with pytest.raises(HloserveError) as info:
        runtime.front()
    assert info.value.status == Status.INVALID_ARGUMENT
    message = info.value.message
    assert f"weight cache budget of {format_size(2 * LIMIT)} does not fit" in message, message
    assert f"bytes_limit {format_size(LIMIT)}" in message, message


def test_a_card_that_cannot_hold_the_largest_model_and_its_scratch_refuses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runtimes: list[Runtime]
) -> None:
    # 150 bytes: 15 of margin and affine's 80 of scratch leave 55 for its 60 of weights
    _fake(tmp_path / "stats.json", monkeypatch, limit=150)
    runtime = Runtime()
    runtimes.append(runtime)
    with pytest.raises(HloserveError) as info:
        runtime.front()
    assert info.value.status == Status.INVALID_ARGUMENT
    message = info.value.message
    assert "cannot hold the weights of 'affine'" in message, message
    assert f"({format_size(AFFINE_WEIGHT_BYTES)})" in message, message
    assert f"bytes_limit {format_size(150)}" in message, message
    assert runtime.server._holds == {}  # nothing is held for the refused bundle


def test_on_cpu_nothing_changes_and_no_device_figures_are_published(
    monkeypatch: pytest.MonkeyPatch, runtimes: list[Runtime]
) -> None:
    monkeypatch.delenv(FAKE_STATS_ENV, raising=False)
    runtime = Runtime()
    runtimes.append(runtime)
    assert runtime.core.store.budget_bytes is None  # the CPU device reports no statistics
    f = runtime.front()
    f.close()
    assert runtime.memory() is None


def test_the_gauges_and_hloserve_status_show_the_faked_card_on_a_real_tritonserver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses
    import shutil

    grpcclient = pytest.importorskip("tritonclient.grpc")
    from hloserve.model_repository_tools.build import build_repository
    from hloserve.node.status import render_status
    from hloserve.node.tritonserver import TritonServer
    from hloserve.prometheus_text import cache_status, fetch_metrics
    from tests.conftest import serving_options

    _fake(tmp_path / "stats.json", monkeypatch)  # the server and its stubs inherit it
    shutil.copytree(GOLDEN / "affine", tmp_path / "bundles" / "affine")
    repo = tmp_path / "repository"
    build_repository(tmp_path / "bundles", repo, front_instances=1)
    options = serving_options(repo)
    options = dataclasses.replace(
        options, env={**options.env, FAKE_STATS_ENV: os.environ[FAKE_STATS_ENV]}
    )
    url = f"http://127.0.0.1:{options.metrics_port}/metrics"

    def device(weights: int) -> dict[str, float]:
        end = time.monotonic() + 30
        while True:  # published once a second
            status = cache_status(fetch_metrics(url))
            complete = set(DEVICE_MEMORY_KINDS) <= set(status.device)  # all published
            if (complete and status.device["weights"] == weights) or time.monotonic() > end:
                return status.device

    with TritonServer(options) as server:
        before = device(0)
        client = grpcclient.InferenceServerClient(server.urls.grpc)
        x = grpcclient.InferInput("x", [1, 4], "FP32")
        x.set_data_from_numpy(np.ones((1, 4), np.float32))
        client.infer("affine", [x])
        client.close()
        after = device(AFFINE_WEIGHT_BYTES)
        table = render_status(cache_status(fetch_metrics(url)))
    for figures in (before, after):
        assert figures["limit"] == LIMIT and figures["in_use"] == IN_USE
        assert figures["peak"] == PEAK and figures["headroom"] == LIMIT - IN_USE
        assert figures["total"] == int(LIMIT / names.DEFAULT_DEVICE_MEMORY_FRACTION)
    assert after["weights"] - before["weights"] == AFFINE_WEIGHT_BYTES
    assert 0 < after["budget"] < LIMIT * (1 - MARGIN)  # on by default, less the scratch
    assert "device memory: total 1.1 GiB, limit 1.0 GiB, in use 300.0 MiB" in table, table


@needs_tritonclient
def test_device_memory_fraction_travels_from_the_flag_to_the_runtime_config(
    tmp_path: Path,
) -> None:
    import argparse
    import shutil

    from hloserve.cli_options import add_weight_cache_options, weight_cache_options
    from hloserve.model_parameters import RuntimeParameters
    from hloserve.model_repository_tools.build import build_repository

    parser = argparse.ArgumentParser()
    add_weight_cache_options(parser)
    options = weight_cache_options(parser.parse_args(["--device-memory-fraction", "0.7"]))
    shutil.copytree(GOLDEN / "affine", tmp_path / "bundles" / "affine")
    build_repository(tmp_path / "bundles", tmp_path / "repo", weight_cache=options)
    config = (tmp_path / "repo" / names.RUNTIME_MODEL / "config.pbtxt").read_text()
    assert f'key: "{names.PARAM_DEVICE_MEMORY_FRACTION}"' in config
    args = _args(**{names.PARAM_DEVICE_MEMORY_FRACTION: "0.7"})
    read = RuntimeParameters.from_parameters(args.name, args.parameters)
    assert read.device_memory_fraction == 0.7
    env: dict[str, str] = {}
    allocator_environment(read.device_memory_fraction, env)
    assert env["XLA_CLIENT_MEM_FRACTION"] == "0.7"
    with pytest.raises(HloserveError, match=r"in \(0, 1\]"):
        RuntimeParameters.from_parameters(
            args.name, _args(**{names.PARAM_DEVICE_MEMORY_FRACTION: "1.5"}).parameters
        )
