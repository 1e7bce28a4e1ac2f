"""Meta models on a real tritonserver: the digits cascade, errors, deadline, and the gate.

One server for the module (2 cores), built with ``meta_concurrency=1`` and one front instance
per model. Bundles: ``digits`` (CNN), ``digits_fast`` and the meta ``digits_cascade`` of
examples/digits_cascade; ``affine`` (golden, plain); ``broken`` (affine whose batch-1 artifact
is swapped for digits' in the built repository: its front loads, the runtime refuses it);
``ghost`` (affine, deleted from the built repository: not served); the metas ``probe`` and
``probe2`` (tests/meta_probe: sleep, then call affine, digits, broken or ghost).
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hloserve.model_repository_tools.build import build_repository
from hloserve.node.tritonserver import TritonServer
from hloserve.prometheus_text import fetch_metrics, parse_samples
from tests.conftest import GOLDEN, ROOT, import_example, serving_options

pytestmark = [pytest.mark.tritonserver, pytest.mark.slow]

grpcclient = pytest.importorskip("tritonclient.grpc")
httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

CASCADE_DIR = ROOT / "examples" / "digits_cascade"
PROBE = Path(__file__).resolve().parents[1] / "meta_probe"
X = np.arange(4, dtype=np.float32)[None] / 4  # affine's input, batch 1
SUBCALLS = "hloserve_meta_subcalls_total"


def cascade_module(name: str) -> Any:
    """examples/digits_cascade/<name>.py, imported as ``digits_cascade_<name>``."""
    return import_example("digits_cascade", name)


@pytest.fixture(scope="module")
def server(digits_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    cascade_export = cascade_module("export")
    bundles = tmp_path_factory.mktemp("meta") / "bundles"
    bundles.mkdir()
    shutil.copytree(digits_bundle, bundles / "digits")
    cascade_export.export_fast(bundles)
    cascade_export.write_meta(bundles)
    for name in ("affine", "broken", "ghost"):
        shutil.copytree(GOLDEN / "affine", bundles / name)
    for name in ("probe", "probe2"):
        shutil.copytree(PROBE, bundles / name, ignore=shutil.ignore_patterns("__pycache__"))
    repo = bundles.parent / "repository"
    build_repository(bundles, repo, front_instances=1, meta_concurrency=1)
    shutil.copyfile(
        repo / "digits" / "1" / "bundle" / "model.b1.mlirbc",
        repo / "broken" / "1" / "bundle" / "model.b1.mlirbc",
    )
    shutil.rmtree(repo / "ghost")
    with TritonServer(serving_options(repo, bundles.parent / "server.log")) as srv:
        yield srv


@pytest.fixture(scope="module", params=["grpc", "http"])
def client(request: pytest.FixtureRequest, server: TritonServer) -> tuple[Any, Any]:
    if request.param == "grpc":
        return grpcclient, grpcclient.InferenceServerClient(server.urls.grpc)
    return httpclient, httpclient.InferenceServerClient(server.urls.http)


def probe(
    module: Any, client: Any, action: int, sleep_ms: int = 0, model: str = "probe", **kw: Any
) -> dict[str, np.ndarray]:
    x = module.InferInput("x", [1, 4], "FP32")
    x.set_data_from_numpy(X)
    ctl = module.InferInput("ctl", [2], "INT32")
    ctl.set_data_from_numpy(np.array([action, sleep_ms], np.int32))
    result = client.infer(model, [x, ctl], **kw)
    return {"y": result.as_numpy("y"), "t": result.as_numpy("t")}


def affine(module: Any, client: Any) -> np.ndarray:
    x = module.InferInput("x", [1, 4], "FP32")
    x.set_data_from_numpy(X)
    return np.asarray(client.infer("affine", [x]).as_numpy("y"))


def refused(module: Any, client: Any, *args: Any, **kw: Any) -> tuple[str, str]:
    """(status, message) of a probe call that must fail; the status as gRPC names it."""
    with pytest.raises(InferenceServerException) as info:
        probe(module, client, *args, **kw)
    status = str(info.value.status())
    http_names = {"400": "INVALID_ARGUMENT", "404": "NOT_FOUND", "503": "UNAVAILABLE"}
    return http_names.get(status, status.removeprefix("StatusCode.")), info.value.message()


def still_serving(module: Any, client: Any) -> None:
    expected = affine(module, client)
    np.testing.assert_array_equal(probe(module, client, 0)["y"], expected)


def test_cascade_equals_the_rule_applied_to_both_models(client: tuple[Any, Any]) -> None:
    module, c = client
    cascade_client = cascade_module("client")
    _, _, images, labels = cascade_client.digits_model.load_split()
    r = cascade_client.run_protocol(c, module, images, 32)
    np.testing.assert_array_equal(r["label"], r["expected"])
    np.testing.assert_array_equal(r["stage"], r["expected_stage"])
    escalated = np.mean(r["stage"] == b"strong")
    assert 0 < escalated < 1  # both stages decide some images
    assert np.mean(r["label"] == labels) >= np.mean(r["fast"] == labels)
    # All 360 images in one request: `call` splits both sub-calls into the callees' batches
    # (at most 32), here 12 to digits_fast and 3 to digits; same answers as in batches of 32.
    assert np.sum(r["stage"] == b"strong") > 64
    label, stage = cascade_client.infer(c, module, "digits_cascade", images, ["label", "stage"])
    np.testing.assert_array_equal(label, r["label"])
    np.testing.assert_array_equal(stage, r["stage"])


def test_cascade_refuses_zero_images(client: tuple[Any, Any]) -> None:
    module, c = client
    image = module.InferInput("image", [0, 8, 8, 1], "FP32")
    image.set_data_from_numpy(np.zeros((0, 8, 8, 1), np.float32))
    with pytest.raises(InferenceServerException) as info:
        c.infer("digits_cascade", [image])
    assert str(info.value.status()) in ("StatusCode.INVALID_ARGUMENT", "400"), info.value
    assert "model 'digits_cascade': batch size 0; a request needs at least one item" in str(
        info.value
    )
    label, _ = cascade_module("client").infer(
        c, module, "digits_cascade", np.zeros((1, 8, 8, 1), np.float32), ["label", "stage"]
    )
    assert label.shape == (1,)  # still serving


def test_undeclared_call_is_refused_naming_the_model(client: tuple[Any, Any]) -> None:
    status, message = refused(*client, 1)
    assert status == "INVALID_ARGUMENT", message
    assert "model 'probe': run called model 'digits', which is not in its meta.calls" in message
    still_serving(*client)


def test_failing_sub_model_error_keeps_its_status_and_name(client: tuple[Any, Any]) -> None:
    status, message = refused(*client, 2)
    assert status == "INVALID_ARGUMENT", message  # the runtime's refusal of the bundle
    assert "model 'probe': call to model 'broken' failed: " in message
    assert "model 'broken' failed to load" in message
    still_serving(*client)


def test_missing_sub_model_is_not_found(client: tuple[Any, Any]) -> None:
    status, message = refused(*client, 3)
    assert status == "NOT_FOUND", message
    assert "model 'probe': call to model 'ghost' failed: model 'ghost' is not served" in message
    still_serving(*client)


def test_deadline_too_short(client: tuple[Any, Any]) -> None:
    # Triton 2.51 has no deadline code for a backend: UNAVAILABLE (503) with the text.
    status, message = refused(*client, 0, 300, timeout=100_000)
    assert status == "UNAVAILABLE", message
    assert "model 'probe': deadline exceeded before calling model 'affine'" in message
    ok = probe(*client, 0, 0, timeout=30_000_000)  # a budget that suffices
    np.testing.assert_array_equal(ok["y"], affine(*client))


def test_cascade_through_the_gateway(server: TritonServer) -> None:
    """The gateway forwards the meta's request (timeout parameter included) unchanged."""
    from hloserve.gateway.config import GatewayConfig
    from hloserve.node.gateway_thread import GatewayThread

    config = GatewayConfig(workers=(server.urls.grpc,))
    gateway = GatewayThread(config.model_copy(update={"listen": "127.0.0.1:0", "admin_port": 0}))
    try:
        via = grpcclient.InferenceServerClient(f"127.0.0.1:{gateway.port}")
        direct = grpcclient.InferenceServerClient(server.urls.grpc)
        cascade_client = cascade_module("client")
        _, _, images, _ = cascade_client.digits_model.load_split()
        answers = [
            cascade_client.infer(c, grpcclient, "digits_cascade", images[:32], ["label", "stage"])
            for c in (via, direct)
        ]
        np.testing.assert_array_equal(answers[0][0], answers[1][0])
        np.testing.assert_array_equal(answers[0][1], answers[1][1])
        status, message = refused(grpcclient, via, 0, 300, timeout=100_000)
        assert status == "UNAVAILABLE" and "deadline exceeded before calling" in message
    finally:
        gateway.close()


def test_gate_runs_two_metas_one_after_the_other_while_models_answer(
    server: TritonServer,
) -> None:
    """meta_concurrency 1: probe and probe2 (one instance each: only the gate orders them)."""
    done = threading.Event()
    answered: list[float] = []

    def plain_traffic() -> None:
        client = grpcclient.InferenceServerClient(server.urls.grpc)
        give_up = time.monotonic() + 120
        for _ in range(20_000):  # bounded in count and time; ends when both metas are done
            if done.is_set() or time.monotonic() > give_up:
                return
            affine(grpcclient, client)
            answered.append(time.time())

    def slow(model: str) -> np.ndarray:
        client = grpcclient.InferenceServerClient(server.urls.grpc)
        return probe(grpcclient, client, 0, 700, model=model)["t"]

    with ThreadPoolExecutor(3) as pool:
        traffic = pool.submit(plain_traffic)
        runs = [pool.submit(slow, m) for m in ("probe", "probe2")]
        windows = sorted(tuple(f.result(timeout=120)) for f in runs)
        done.set()
        traffic.result(timeout=60)
    (start1, end1), (start2, end2) = windows
    assert end1 <= start2, f"the two meta runs overlapped: {windows}"
    inside = [t for t in answered if start1 <= t <= end2]
    assert inside, f"no plain request answered while the metas ran ({len(answered)} in all)"


def test_sub_calls_to_bundles_bypass_the_callees_triton_statistics(server: TritonServer) -> None:
    """A meta reaches a bundle over the runtime's channel, not through Triton: the callee's
    Triton statistics count client requests only (docs/meta_models.md)."""
    client = grpcclient.InferenceServerClient(server.urls.grpc)

    def successes() -> int:
        stats = client.get_inference_statistics("affine", as_json=True)
        [model] = [m for m in stats["model_stats"] if m["name"] == "affine"]
        return int(model["inference_stats"]["success"].get("count", 0))

    def subcalls() -> float:  # hloserve's own count of the metas' sub-calls to affine
        text = fetch_metrics(f"http://{server.urls.metrics}/metrics")
        samples = parse_samples(text)
        return sum(v for n, labels, v in samples if n == SUBCALLS and labels["model"] == "affine")

    before, counted = successes(), subcalls()
    np.testing.assert_array_equal(probe(grpcclient, client, 0)["y"], affine(grpcclient, client))
    assert successes() == before + 1  # the direct request only, not the probe's sub-call
    assert subcalls() == counted + 1  # the probe's sub-call, counted by the meta
