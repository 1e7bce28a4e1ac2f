"""READY means servable, on a real tritonserver (docs/serving.md, "READY means servable").

A front's ``initialize`` returns only once the runtime has compiled its bundle, so the first
request sent the moment a model reports READY runs at once, and a bundle loaded in line behind
others (two load threads, six bundles) never times out nor stalls. Both servers start as
``serve`` and ``node up`` do: explicit model control, the runtime loaded first, the others
through the repository API.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hloserve import names
from hloserve.model_control import grpc_metadata
from hloserve.model_repository_tools.build import build_repository
from hloserve.node.tritonserver import TritonServer
from tests.conftest import GOLDEN, serving_options

grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

#: layers of the deep bundle: its 4 executables take a few seconds to compile on 2 CPU cores
LAYERS = 8
SIZES = [1, 2, 4, 8]
WIDTH = 16


def _deep(p: Any, x: Any) -> Any:
    import jax.numpy as jnp

    for i in range(LAYERS):
        x = jnp.tanh(x @ p["w"][i] + p["b"][i])
    return x


def _export_deep(out: Path) -> Path:
    """A bundle whose cold compile takes over a second: a chain of ``LAYERS`` dense layers at
    batch sizes ``SIZES``."""
    from hloserve.export import OutputSpec, TensorSpec, export_bundle

    rng = np.random.default_rng(0)
    params = {
        "w": (rng.standard_normal((LAYERS, WIDTH, WIDTH)) * 0.1).astype(np.float32),
        "b": np.zeros((LAYERS, WIDTH), np.float32),
    }
    spec = TensorSpec(name="x", dtype="f32", shape="nk", dims={"k": WIDTH})
    export_bundle(_deep, params, [spec], [OutputSpec("y", "nk")], SIZES, out)
    return out


def _server(repo: Path, log: Path, *args: str, load: str = names.RUNTIME_MODEL) -> TritonServer:
    """A server in explicit mode loading ``load`` at start (``*``: every model at once)."""
    options = serving_options(repo, log)
    options = dataclasses.replace(
        options,
        model_control_mode="explicit",
        load_models=(load,),
        extra_args=(*options.extra_args, *args),
    )
    return TritonServer(options)


def _ready(client: Any, model: str) -> bool:
    """Whether ``model`` reports READY (False while the server does not answer yet)."""
    try:
        return bool(client.is_model_ready(model))
    except InferenceServerException:
        return False


@pytest.fixture
def cold_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty executable cache for this test's server: every executable compiles."""
    directory = tmp_path / "executable_cache"
    directory.mkdir()
    monkeypatch.setenv("HLOSERVE_EXECUTABLE_CACHE", str(directory))
    yield directory


def _affine_repo(root: Path, models: list[str], *, front_instances: int) -> Path:
    """A repository of copies of the golden affine bundle named ``models``, under ``root``."""
    for model in models:
        shutil.copytree(GOLDEN / "affine", root / "bundles" / model)
    build_repository(root / "bundles", root / "repository", front_instances=front_instances)
    return root / "repository"


def _loaded_seconds(log: Path, model: str) -> float | None:
    """The runtime's "model 'm' loaded in X s" time for ``model``, or None before it."""
    found = re.search(rf"model '{model}' loaded in ([0-9.]+) s", log.read_text(errors="replace"))
    return float(found.group(1)) if found else None


def test_the_first_request_at_ready_is_answered_without_compiling(
    tmp_path: Path, cold_cache: Path
) -> None:
    bundles = tmp_path / "bundles"
    _export_deep(bundles / "deep")
    repo = tmp_path / "repository"
    build_repository(bundles, repo, front_instances=1)
    log = tmp_path / "server.log"
    x = grpcclient.InferInput("x", [1, WIDTH], "FP32")
    x.set_data_from_numpy(np.ones((1, WIDTH), np.float32))
    # every model loads at once, the runtime on one of Triton's load threads and the front on
    # another: the front's initialize must wait for the runtime to listen and then compile
    server = _server(repo, log, load="*")
    server.start()
    try:
        client = grpcclient.InferenceServerClient(server.urls.grpc)
        end = time.monotonic() + 300
        while not _ready(client, "deep"):  # the moment it reports READY
            assert time.monotonic() < end and server.is_running(), server.log_tail()
            time.sleep(0.005)
        compiled_before_ready = _loaded_seconds(log, "deep")
        begun = time.perf_counter()
        y = client.infer("deep", [x]).as_numpy("y")
        first = time.perf_counter() - begun
        client.close()
    finally:
        server.stop()
    assert y.shape == (1, WIDTH)
    assert compiled_before_ready is not None, "READY before the runtime's compile finished"
    assert len(list(cold_cache.rglob("*"))) > 0  # the cache was cold: the executables compiled
    # the log rounds to 0.1 s; a compile this long is still far above one request at READY
    assert compiled_before_ready >= 0.5, f"cold compile {compiled_before_ready} s: too fast to tell"
    print(f"cold compile {compiled_before_ready:.2f} s, first request at READY {first:.3f} s")
    assert first <= 0.25 * compiled_before_ready, (first, compiled_before_ready)


def test_six_bundles_with_two_load_threads_all_load_compiled_without_a_stall(
    tmp_path: Path, cold_cache: Path
) -> None:
    models = [f"affine{i}" for i in range(6)]
    repo = _affine_repo(tmp_path, models, front_instances=2)
    log = tmp_path / "server.log"
    x = grpcclient.InferInput("x", [1, 4], "FP32")
    x.set_data_from_numpy(np.ones((1, 4), np.float32))
    with _server(repo, log, "--model-load-thread-count=2") as server:
        client = grpcclient.InferenceServerClient(server.urls.grpc)
        control = dict(grpc_metadata(server.options.model_control_key))
        errors: list[Exception] = []

        def load(model: str) -> None:
            try:
                client.load_model(model, headers=control)
            except Exception as exc:  # reported below
                errors.append(exc)

        begun = time.monotonic()
        loaders = [threading.Thread(target=load, args=(m,)) for m in models]
        for thread in loaders:
            thread.start()
        for thread in loaders:
            thread.join(240)
        seconds = time.monotonic() - begun
        assert errors == [] and not any(t.is_alive() for t in loaders)
        assert all(client.is_model_ready(m) for m in models)
        for model in models:  # every one compiled before READY: the runtime logged it
            assert _loaded_seconds(log, model) is not None, model
            assert client.infer(model, [x]).as_numpy("y").shape == (1, 3)
        client.close()
    # no stall: nowhere near the front's flat wait (names.DEFAULT_RUNTIME_WAIT_S)
    assert seconds < names.DEFAULT_RUNTIME_WAIT_S / 2, seconds


def test_fronts_taking_every_load_thread_before_the_runtime_do_not_deadlock(
    tmp_path: Path,
) -> None:
    # six fronts named before hloserve_runtime, every model at once on Triton's 4 load
    # threads: the fronts take them all first, and waiting for the runtime would hold them
    # until hloserve.runtime_wait_s; without a runtime stub they stop waiting after the grace
    models = [f"a{i}" for i in range(6)]
    repo = _affine_repo(tmp_path, models, front_instances=1)
    begun = time.monotonic()
    with _server(repo, tmp_path / "server.log", load="*") as server:
        seconds = time.monotonic() - begun
        client = grpcclient.InferenceServerClient(server.urls.grpc)
        assert all(client.is_model_ready(m) for m in models)
        client.close()
    assert seconds < names.DEFAULT_RUNTIME_WAIT_S / 2, seconds
