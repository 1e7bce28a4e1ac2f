"""Explicit model control and CUDA shared memory through the gateway, over KServe HTTP and
gRPC, on two real tritonservers (docs/gateway.md, "Model control"; issues 12 and 13).

Both workers run explicit model control with the launcher's key. Their repositories hold
``affine`` and copies of it (``broken``, ``ghost``, ``lone``), and the metas ``probe`` and
``probe2`` (tests/meta_probe: they call ``affine``, ``broken`` and ``ghost``, which are plain
affine copies here); worker 0's repository also has ``solo``. At start worker 0 has loaded
``affine``, worker 1 ``affine`` and ``broken``: no worker holds a meta's whole group. Two
gateways front the same workers: ``round_robin`` (a model no worker holds goes to every
worker whose repository has it) and ``lpt_packing`` (one replica, where the placement says).
The tests run in file order and build on each other's loads.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import shutil
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from hloserve import names
from hloserve.gateway.config import DiscoveryConfig, GatewayConfig
from hloserve.model_control import GRPC_METADATA_KEY, http_headers, launcher_key
from hloserve.model_repository_tools.build import build_repository
from hloserve.model_repository_tools.build_options import SchedulingOptions
from hloserve.node.gateway_thread import GatewayThread
from hloserve.node.tritonserver import TritonServer
from tests.conftest import GOLDEN, serving_options
from tests.gateway.test_http_tritonserver import FREE_PORTS, _call, _index
from tests.meta.test_serve import PROBE, X

pytestmark = [pytest.mark.tritonserver, pytest.mark.slow]

grpcclient = pytest.importorskip("tritonclient.grpc")
httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

#: Seconds between the gateways' discovery passes: the table must follow a load within one.
POLL_S = 1.0
CALLEES = ("affine", "broken", "ghost")


def worker_states(servers: list[TritonServer], model: str) -> list[str | None]:
    """Each worker's state of ``model`` in its own index (None: not in its repository)."""
    found = []
    for server in servers:
        rows = {r["name"]: r for r in _index(server.urls.http)}
        found.append(rows[model].get("state", "") if model in rows else None)
    return found


@dataclass
class Fleet:
    servers: list[TritonServer]
    round_robin: GatewayThread
    lpt: GatewayThread

    def states(self, model: str) -> list[str | None]:
        return worker_states(self.servers, model)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("gateway_model_control")
    repos = []
    for i, extra in enumerate(((["solo"]), [])):
        bundles = root / f"w{i}" / "bundles"
        for name in ("affine", "broken", "ghost", "lone", *extra):
            shutil.copytree(GOLDEN / "affine", bundles / name)
        for name in ("probe", "probe2"):
            shutil.copytree(PROBE, bundles / name, ignore=shutil.ignore_patterns("__pycache__"))
        repo = root / f"w{i}" / "repository"
        build_repository(bundles, repo, scheduling=SchedulingOptions(scheduling="fifo"))
        repos.append(repo)
    loads = [(names.RUNTIME_MODEL, "affine"), (names.RUNTIME_MODEL, "affine", "broken")]
    with ExitStack() as stack:
        servers = [
            stack.enter_context(
                TritonServer(
                    dataclasses.replace(
                        serving_options(repo), model_control_mode="explicit", load_models=load
                    )
                )
            )
            for repo, load in zip(repos, loads, strict=True)
        ]
        config = GatewayConfig(
            workers=tuple(s.urls.grpc for s in servers),
            worker_http=tuple(s.urls.http for s in servers),
            discovery=DiscoveryConfig(poll_interval_seconds=POLL_S),
        )
        gateways = []
        for mode in ("round_robin", "lpt_packing"):
            gateway = GatewayThread(config.model_copy(update={**FREE_PORTS, "mode": mode}))
            stack.callback(gateway.close)
            assert gateway.http_address is not None
            gateways.append(gateway)
        yield Fleet(servers, *gateways)


def _http(gateway: GatewayThread) -> str:
    assert gateway.http_address is not None
    return gateway.http_address


def _key() -> dict[str, str]:
    headers = http_headers(launcher_key())
    assert headers is not None
    return headers


def _affine_over_http(address: str, model: str) -> tuple[int, Any]:
    """(status, outputs) of ``model`` (an affine copy) run on X over plain HTTP JSON."""
    body = {
        "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": X.ravel().tolist()}]
    }
    status, reply = _call(address, "POST", f"/v2/models/{model}/infer", json.dumps(body).encode())
    return status, json.loads(reply)


def _until_served(address: str, model: str) -> Any:
    """The first 200 answer for ``model`` through the gateway, polled (bounded) for one
    discovery interval plus the layout's sync."""
    deadline = time.monotonic() + POLL_S + 5
    while True:
        status, reply = _affine_over_http(address, model)
        if status == 200 or time.monotonic() > deadline:
            assert status == 200, reply
            return reply
        time.sleep(0.1)


def test_http_load_of_a_model_one_worker_has_goes_there_and_is_served(fleet: Fleet) -> None:
    """``solo`` is only in worker 0's repository: the round-robin gateway loads it there (not
    on every worker: worker 1 would refuse), answers Triton's own 200, and serves it; an HTTP
    unload removes it and the gateway answers Triton's 404 for it again."""
    address = _http(fleet.round_robin)
    assert fleet.states("solo") == ["", None]
    path = "/v2/repository/models/solo/load"
    assert _call(address, "POST", path, headers=_key()) == (200, b"")
    assert fleet.states("solo") == ["READY", None]
    expected = _affine_over_http(fleet.servers[0].urls.http, "affine")[1]["outputs"]
    assert _until_served(address, "solo")["outputs"] == expected

    path = "/v2/repository/models/solo/unload"
    assert _call(address, "POST", path, headers=_key()) == (200, b"")
    assert fleet.states("solo")[0] in ("UNLOADING", "UNAVAILABLE")
    deadline = time.monotonic() + POLL_S + 5
    while True:  # bounded: until the table and HAProxy's map no longer hold it
        status, reply = _affine_over_http(address, "solo")
        if status != 200 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert status == 404, reply
    assert "Request for unknown model: 'solo'" in reply["error"]


def test_a_refused_load_is_the_workers_own_answer(fleet: Fleet) -> None:
    """A name no repository has goes to every worker; each refuses and the first refusal is
    relayed byte for byte (status, body, Content-Type), over HTTP and gRPC; a load without
    the key is refused by the workers (403) and, through the gateway, by the gateway itself
    before any worker (401: no credential, docs/gateway.md "Control plane: authentication")."""
    address = _http(fleet.round_robin)
    path = "/v2/repository/models/nope/load"
    own = _call(fleet.servers[0].urls.http, "POST", path, headers=_key())
    assert own == (
        500,
        b'{"error":"failed to load \'nope\', failed to poll from model repository"}',
    )
    assert _call(address, "POST", path, headers=_key()) == own
    no_key = _call(fleet.servers[0].urls.http, "POST", "/v2/repository/models/lone/load")
    assert no_key[0] == 403 and b"This API is restricted" in no_key[1]
    refused = _call(address, "POST", "/v2/repository/models/lone/load")
    assert refused[0] == 401 and b"model control needs a credential" in refused[1]
    assert fleet.states("lone") == ["", ""]
    client = grpcclient.InferenceServerClient(fleet.round_robin.address)
    with pytest.raises(InferenceServerException) as info:
        client.load_model("nope", headers={GRPC_METADATA_KEY: launcher_key()})
    assert info.value.status() == "StatusCode.INTERNAL"
    assert "failed to load 'nope', failed to poll from model repository" in info.value.message()


def test_lpt_packing_places_a_never_loaded_model_on_one_worker_over_http(fleet: Fleet) -> None:
    address = _http(fleet.lpt)
    path = "/v2/repository/models/lone/load"
    assert _call(address, "POST", path, headers=_key()) == (200, b"")
    assert sorted(fleet.states("lone")) == ["", "READY"]  # one replica: one worker
    assert _until_served(address, "lone")["outputs"][0]["name"] == "y"


def test_a_meta_no_worker_holds_is_loaded_with_its_whole_group_over_grpc(fleet: Fleet) -> None:
    """No worker holds ``probe``'s group (nobody has ``ghost``): lpt_packing places the group
    on one worker, loads the callees missing there, then the meta; the other worker does not
    keep ``probe``; the meta answers through the gateway as ``affine`` does."""
    client = grpcclient.InferenceServerClient(fleet.lpt.address)
    client.load_model("probe", headers={GRPC_METADATA_KEY: launcher_key()})
    states = {m: fleet.states(m) for m in ("probe", *CALLEES)}
    (home,) = [i for i, s in enumerate(states["probe"]) if s == "READY"]
    assert all(states[c][home] == "READY" for c in CALLEES), states
    assert states["probe"][1 - home] in ("", "UNLOADING", "UNAVAILABLE"), states
    x = grpcclient.InferInput("x", [1, 4], "FP32")
    x.set_data_from_numpy(X)
    ctl = grpcclient.InferInput("ctl", [2], "INT32")
    ctl.set_data_from_numpy(np.array([0, 0], np.int32))  # call affine at once
    direct = grpcclient.InferenceServerClient(fleet.servers[home].urls.grpc)
    expected = direct.infer("probe", [x, ctl]).as_numpy("y")
    deadline = time.monotonic() + POLL_S + 5
    while True:  # bounded: the table follows within a discovery pass
        try:
            got = client.infer("probe", [x, ctl]).as_numpy("y")
            break
        except InferenceServerException:
            assert time.monotonic() < deadline, "probe not served through the gateway"
            time.sleep(0.1)
    np.testing.assert_array_equal(got, expected)
    # moved from the other worker (it was loaded there to read its config) or never there
    other = fleet.servers[1 - home].urls.http
    deadline = time.monotonic() + 30
    while (row := _row(other, "probe")).get("state") == "UNLOADING":  # bounded
        assert time.monotonic() < deadline, row
        time.sleep(0.1)
    assert row in ({"name": "probe"}, _UNLOADED_ROW), row
    # a reload goes to the worker holding it: Triton's "unloaded" row is not a holder
    client.load_model("probe", headers={GRPC_METADATA_KEY: launcher_key()})
    states = fleet.states("probe")
    assert states[home] == "READY" and states[1 - home] != "READY", states


#: Triton's index row of a model unloaded on request (tritonserver 2.51).
_UNLOADED_ROW = {"name": "probe", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}


def _row(address: str, model: str) -> dict[str, str]:
    (row,) = [r for r in _index(address) if r["name"] == model]
    return row


def test_a_meta_goes_only_to_the_workers_holding_its_callees_over_http(fleet: Fleet) -> None:
    """Now one worker holds the whole group: ``probe2`` (never loaded) goes there alone, even
    through the round-robin gateway that sends a plain model to every worker."""
    group = [all(fleet.states(c)[i] == "READY" for c in CALLEES) for i in (0, 1)]
    assert sorted(group) == [False, True]
    home = group.index(True)
    address = _http(fleet.round_robin)
    path = "/v2/repository/models/probe2/load"
    assert _call(address, "POST", path, headers=_key()) == (200, b"")
    states = fleet.states("probe2")
    assert states[home] == "READY" and states[1 - home] != "READY", states


def test_cuda_shared_memory_follows_the_system_shared_memory_rules(fleet: Fleet) -> None:
    """CPU-only tritonservers: status lists no region; a register with a handle no worker
    can open is refused by every worker and the first refusal relayed (HTTP: Triton's own
    answer; gRPC: its code); unregistering everything succeeds; nothing stays registered."""
    address = _http(fleet.round_robin)
    worker = fleet.servers[0].urls.http
    cuda = "/v2/cudasharedmemory"
    assert _call(address, "GET", f"{cuda}/status") == _call(worker, "GET", f"{cuda}/status")
    assert _call(address, "GET", f"{cuda}/status")[1] == b"[]"
    region = f"{cuda}/region/gwc_r/status"
    assert _call(address, "GET", region) == _call(worker, "GET", region)
    assert _call(address, "GET", region)[0] == 404
    handle = base64.b64encode(bytes(64)).decode()  # a cudaIpcMemHandle_t is 64 bytes
    body = json.dumps({"raw_handle": {"b64": handle}, "device_id": 0, "byte_size": 64}).encode()
    path = f"{cuda}/region/gwc_r/register"
    own = _call(worker, "POST", path, body)
    assert own == (400, b'{"error":"failed to register shared memory region: invalid args"}')
    assert _call(address, "POST", path, body) == own
    for path in (f"{cuda}/unregister", f"{cuda}/region/gwc_r/unregister"):
        assert _call(address, "POST", path) == (200, b"")
    for server in fleet.servers:
        assert _call(server.urls.http, "GET", f"{cuda}/status")[1] == b"[]"

    client = grpcclient.InferenceServerClient(fleet.round_robin.address)
    assert not client.get_cuda_shared_memory_status().regions
    with pytest.raises(InferenceServerException) as info:
        client.register_cuda_shared_memory("gwc_g", bytes(64), 0, 64)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "failed to register shared memory region" in info.value.message()
    client.unregister_cuda_shared_memory()
    for server in fleet.servers:
        direct = grpcclient.InferenceServerClient(server.urls.grpc)
        assert not direct.get_cuda_shared_memory_status().regions


def test_an_over_long_file_override_is_refused_and_the_workers_keep_serving(fleet: Fleet) -> None:
    """A load whose ``file:`` override has a first path component over 255 bytes stops
    tritonserver 2.51 (measured: "terminate called after throwing an instance of
    std::filesystem::filesystem_error ... File name too long"; a deeper one gets its 500):
    the gateway refuses every component over 255 bytes before any worker, in the status and
    words tritonserver gives for the deeper one (compared here), over HTTP and gRPC, naming
    the model, the parameter and the limit; both workers stay live and ``affine`` is served
    as before. A normal-length override is forwarded: the gateway's answer is the worker's
    own."""
    address = _http(fleet.round_robin)
    expected = _affine_over_http(fleet.servers[0].urls.http, "affine")[1]["outputs"]
    before = fleet.states("affine")
    long_name = "file:" + "a" * 256 + "/model.py"  # stops tritonserver 2.51
    content = base64.b64encode(b"x = 1\n").decode()
    body = json.dumps({"parameters": {"config": "{}", long_name: content}}).encode()
    deeper = json.dumps({"parameters": {"file:1/" + "a" * 256: content}}).encode()
    worker = _call(
        fleet.servers[0].urls.http,
        "POST",
        "/v2/repository/models/nope/load",
        deeper,
        headers=_key(),
    )  # what tritonserver itself answers where it does not stop
    worker_error = json.loads(worker[1])["error"]
    assert "failed to poll from model repository" in worker_error, worker
    status, reply = _call(
        address, "POST", "/v2/repository/models/affine/load", body, headers=_key()
    )
    assert status == worker[0], reply
    error = json.loads(reply)["error"]
    assert error.startswith(worker_error.replace("'nope'", "'affine'")), (error, worker_error)
    assert "'affine'" in error and "file:aaa" in error, error
    assert "path component of 256 bytes" in error and "255 bytes per path component" in error

    client = grpcclient.InferenceServerClient(fleet.round_robin.address)
    key = {GRPC_METADATA_KEY: launcher_key()}
    with pytest.raises(InferenceServerException) as info:
        client.load_model("affine", headers=key, config="{}", files={long_name: b"x = 1\n"})
    with pytest.raises(InferenceServerException) as direct_info:  # tritonserver's own answer
        grpcclient.InferenceServerClient(fleet.servers[0].urls.grpc).load_model(
            "nope", headers=key, config="{}", files={"file:1/" + "a" * 256: b"x = 1\n"}
        )
    assert info.value.status() == direct_info.value.status() == "StatusCode.INTERNAL"
    own = direct_info.value.message().replace("'nope'", "'affine'")
    assert "failed to poll from model repository" in own, own
    assert info.value.message().startswith(own), (info.value.message(), own)
    assert "'affine'" in info.value.message() and "255 bytes" in info.value.message()

    for server in fleet.servers:  # sent to no worker: each is live and holds what it held
        assert _call(server.urls.http, "GET", "/v2/health/live")[0] == 200
    assert fleet.states("affine") == before
    assert _until_served(address, "affine")["outputs"] == expected

    normal = json.dumps({"parameters": {"file:1/model.py": content}}).encode()
    path = "/v2/repository/models/nope/load"  # in no repository: every worker answers
    own = _call(fleet.servers[0].urls.http, "POST", path, normal, headers=_key())
    assert own[0] == 500 and b"failed to load 'nope'" in own[1], own  # the worker's words
    assert _call(address, "POST", path, normal, headers=_key()) == own
    direct = grpcclient.InferenceServerClient(fleet.servers[0].urls.grpc)
    with pytest.raises(InferenceServerException) as info:
        direct.load_model("nope", headers=key, files={"file:1/model.py": b"x = 1\n"})
    worker_answer = (info.value.status(), info.value.message())
    with pytest.raises(InferenceServerException) as info:
        client.load_model("nope", headers=key, files={"file:1/model.py": b"x = 1\n"})
    assert info.value.status() == worker_answer[0]
    assert worker_answer[1] in info.value.message()
    for server in fleet.servers:
        assert _call(server.urls.http, "GET", "/v2/health/live")[0] == 200
