"""An ensemble through the gateway on two real tritonservers (issue 27 item 5;
hloserve/gateway/discovery.py ``group_calls``; docs/gateway.md): it is routed only to a worker
serving all its steps, and a load where no worker holds it places the steps first.

Both workers' repositories hold ``affine``, its copy ``twin`` and the ensemble ``ens``
(``affine`` and ``twin`` side by side on ``x``: outputs ``y_a`` and ``y_b``). Worker 0 loads
all three, and so does worker 1 until its step ``twin`` is unloaded there; ``ens2`` (the same
ensemble) is loaded by no worker at start.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Iterator
from contextlib import ExitStack, closing
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hloserve import names
from hloserve.gateway.config import DiscoveryConfig, GatewayConfig
from hloserve.model_control import GRPC_METADATA_KEY, launcher_key
from hloserve.model_repository_tools.build import build_repository
from hloserve.model_repository_tools.build_options import SchedulingOptions
from hloserve.node.gateway_thread import GatewayThread
from hloserve.node.tritonserver import TritonServer
from tests.conftest import GOLDEN, serving_options
from tests.gateway.test_http_tritonserver import FREE_PORTS
from tests.gateway.test_model_control_tritonserver import worker_states
from tests.meta.test_serve import X

pytestmark = [pytest.mark.tritonserver, pytest.mark.slow]

grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

POLL_S = 1.0
STEPS = ("affine", "twin")
ENSEMBLE = """name: "ens"
platform: "ensemble"
max_batch_size: 2
input { name: "x" data_type: TYPE_FP32 dims: [4] }
output { name: "y_a" data_type: TYPE_FP32 dims: [3] }
output { name: "y_b" data_type: TYPE_FP32 dims: [3] }
ensemble_scheduling {
  step {
    model_name: "affine" model_version: -1
    input_map { key: "x" value: "x" } output_map { key: "y" value: "y_a" }
  }
  step {
    model_name: "twin" model_version: -1
    input_map { key: "x" value: "x" } output_map { key: "y" value: "y_b" }
  }
}
"""


def _bundles(root: Path) -> Path:
    """``affine``, ``twin`` and the ensembles ``ens`` and ``ens2`` (the same) under ``root``."""
    for name in STEPS:
        shutil.copytree(GOLDEN / "affine", root / name)
    for ensemble in ("ens", "ens2"):
        (root / ensemble / "1").mkdir(parents=True)
        (root / ensemble / "config.pbtxt").write_text(ENSEMBLE.replace('"ens"', f'"{ensemble}"'))
    return root


@dataclasses.dataclass
class Fleet:
    servers: list[TritonServer]
    config: GatewayConfig

    def gateway(self, mode: str) -> GatewayThread:
        """A gateway in ``mode`` in front of the workers (the caller closes it)."""
        return GatewayThread(self.config.model_copy(update={**FREE_PORTS, "mode": mode}))

    def states(self, model: str) -> list[str | None]:
        return worker_states(self.servers, model)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("ensemble_fleet")
    repos = []
    for i in range(2):
        bundles = _bundles(root / f"w{i}" / "bundles")  # ens2: loaded by no worker at start
        repo = root / f"w{i}" / "repository"
        build_repository(
            bundles, repo, front_instances=1, scheduling=SchedulingOptions(scheduling="fifo")
        )
        repos.append(repo)
    load = (names.RUNTIME_MODEL, *STEPS, "ens")
    with ExitStack() as stack:
        servers = [
            stack.enter_context(
                TritonServer(
                    dataclasses.replace(
                        serving_options(repo), model_control_mode="explicit", load_models=load
                    )
                )
            )
            for repo in repos
        ]
        config = GatewayConfig(
            workers=tuple(s.urls.grpc for s in servers),
            worker_http=tuple(s.urls.http for s in servers),
            discovery=DiscoveryConfig(poll_interval_seconds=POLL_S),
        )
        yield Fleet(servers, config)


def _key() -> dict[str, str]:
    return {GRPC_METADATA_KEY: launcher_key()}


def _inputs() -> list[Any]:
    x = grpcclient.InferInput("x", [1, 4], "FP32")
    x.set_data_from_numpy(X)
    return [x]


def _count(server: TritonServer, model: str) -> int:
    """``model``'s successful inferences on ``server`` (its own statistics)."""
    client = grpcclient.InferenceServerClient(server.urls.grpc)
    stats = client.get_inference_statistics(model).model_stats
    return sum(s.inference_stats.success.count for s in stats)


def test_an_ensemble_is_routed_only_to_the_worker_serving_all_its_steps(fleet: Fleet) -> None:
    """``twin`` is unloaded on worker 1: its ``ens`` (still in its index) gets no request;
    worker 0 answers every one, equal to its direct answer."""
    worker1 = grpcclient.InferenceServerClient(fleet.servers[1].urls.grpc)
    worker1.unload_model("twin", headers=_key())
    # tritonserver 2.51 unloads the ensemble with its step (measured): not READY on worker 1
    deadline = time.monotonic() + 30
    while (states := fleet.states("ens"))[1] == "READY":  # bounded
        assert time.monotonic() < deadline, states
        time.sleep(0.1)
    assert states[0] == "READY", states
    before = _count(fleet.servers[0], "ens")
    direct = grpcclient.InferenceServerClient(fleet.servers[0].urls.grpc).infer("ens", _inputs())
    with closing(fleet.gateway("round_robin")) as gateway:
        client = grpcclient.InferenceServerClient(gateway.address)
        for _ in range(8):
            got = client.infer("ens", _inputs())
            for name in ("y_a", "y_b"):
                np.testing.assert_array_equal(got.as_numpy(name), direct.as_numpy(name))
    deadline = time.monotonic() + 10
    while _count(fleet.servers[0], "ens") < before + 9:  # bounded: statistics follow the answers
        assert time.monotonic() < deadline, (before, _count(fleet.servers[0], "ens"))
        time.sleep(0.1)
    assert _count(fleet.servers[0], "ens") == before + 9  # the direct one and the gateway's 8


def test_a_load_of_an_ensemble_no_worker_holds_places_its_steps_first(fleet: Fleet) -> None:
    """No worker holds ``ens2``'s whole group and none has ``ens2``: lpt_packing places the
    group on one worker (the step missing there loaded), then ``ens2``, and serves it; the
    other worker ends without ``ens2``."""
    # no worker holds the whole group: worker 1 lacks twin (above), worker 0 now lacks affine
    grpcclient.InferenceServerClient(fleet.servers[0].urls.grpc).unload_model(
        "affine", headers=_key()
    )
    assert fleet.states("affine")[0] != "READY" and fleet.states("twin")[1] != "READY"
    with closing(fleet.gateway("lpt_packing")) as gateway:
        _load_and_serve(fleet, grpcclient.InferenceServerClient(gateway.address))


def _load_and_serve(fleet: Fleet, client: Any) -> None:
    client.load_model("ens2", headers=_key())
    states = {m: fleet.states(m) for m in ("ens2", *STEPS)}
    deadline = time.monotonic() + 30
    while sum(s == "READY" for s in states["ens2"]) != 1:  # bounded: a config read's copy goes
        assert time.monotonic() < deadline, states
        time.sleep(0.1)
        states = {m: fleet.states(m) for m in ("ens2", *STEPS)}
    home = states["ens2"].index("READY")
    assert all(states[step][home] == "READY" for step in STEPS), states
    direct = grpcclient.InferenceServerClient(fleet.servers[home].urls.grpc)
    expected = direct.infer("ens2", _inputs())
    deadline = time.monotonic() + POLL_S + 5
    while True:  # bounded: the table follows within a discovery pass
        try:
            got = client.infer("ens2", _inputs())
            break
        except InferenceServerException:
            assert time.monotonic() < deadline, "ens2 not served through the gateway"
            time.sleep(0.1)
    for name in ("y_a", "y_b"):
        np.testing.assert_array_equal(got.as_numpy(name), expected.as_numpy(name))
