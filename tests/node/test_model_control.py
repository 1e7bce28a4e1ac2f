"""Explicit model control everywhere, the repository API restricted to the launcher's key.

Unit tests of the flags and where the key goes (serve, fleet gateway, node, docker), then a
real tritonserver behind ``hloserve serve`` on a loopback and on a 0.0.0.0 host (clients
connect over loopback only): a load without the key is refused, the watchdog's reload with
it works.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
from pathlib import Path

import numpy as np
import pytest

from hloserve import model_control
from hloserve.errors import InvalidArgumentError
from hloserve.model_control import (
    ENV_KEY,
    GRPC_METADATA_KEY,
    HEADER,
    check_key,
    launcher_key,
    new_key,
    restricted_flags,
)
from hloserve.node.plan import fleet_gateway_config
from hloserve.node.serve_options import ServeOptions, server_options

KEY = "hmtestkey0123456789abcdef"


def test_flags_use_tritonserver_2_51_syntax_and_keys_are_checked() -> None:
    assert restricted_flags(KEY) == [
        f"--http-restricted-api=model-repository:hloserve-model-control={KEY}",
        f"--grpc-restricted-protocol=model-repository:hloserve-model-control={KEY}",
    ]
    assert model_control.http_headers(KEY) == {HEADER: KEY}
    assert model_control.grpc_metadata(KEY) == ((GRPC_METADATA_KEY, KEY),)
    assert model_control.http_headers(None) is None and model_control.grpc_metadata(None) == ()
    key = new_key()
    assert check_key(key) == key and key != new_key()
    for bad in ("short", "has=equals-sign-inside", "1234567890123456789", "a:b" * 8, "x" * 300):
        with pytest.raises(InvalidArgumentError, match=ENV_KEY):
            check_key(bad)
    assert launcher_key({ENV_KEY: KEY}) == KEY
    made = launcher_key({})  # one random key per process, which an in-process gateway sends
    assert made != KEY and launcher_key({}) == made and check_key(made) == made
    assert model_control.local_key({}) == made
    assert model_control.local_key({ENV_KEY: KEY}) == KEY
    with pytest.raises(InvalidArgumentError, match="starting with a letter"):
        launcher_key({ENV_KEY: "0" * 20})


def test_serve_restricts_explicit_mode_and_hands_the_key_to_its_gateway(tmp_path: Path) -> None:
    pytest.importorskip("pytriton")  # the wheel's tritonserver builds the command line
    options = ServeOptions(path=tmp_path, host="0.0.0.0", model_control_key=KEY)
    server = server_options(options, tmp_path)
    assert (server.model_control_mode, server.model_control_key) == ("explicit", KEY)
    assert KEY not in repr(server) and KEY not in repr(options)
    from hloserve.node.triton_install import TritonInstall
    from hloserve.node.tritonserver import TritonServer

    install = TritonInstall.from_pytriton_wheel()
    argv = TritonServer(server)._argv(install, tmp_path)
    assert [a for a in argv if "restricted" in a] == restricted_flags(KEY)
    none = server_options(ServeOptions(path=tmp_path, model_control_mode="none"), tmp_path)
    assert not [a for a in TritonServer(none)._argv(install, tmp_path) if "restricted" in a]
    other = dataclasses.replace(server, grpc_port=9001, http_port=9000, metrics_port=9002)
    gateway = fleet_gateway_config([server, other], "127.0.0.1:8001", 0, environ={})
    key = gateway.upstream.model_control_key
    assert key is not None and key.get_secret_value() == KEY
    plain = fleet_gateway_config([none], "127.0.0.1:8001", 0, environ={})
    assert plain.upstream.model_control_key is None


def test_node_restricts_explicit_workers_and_gives_its_gateway_the_key(tmp_path: Path) -> None:
    from hloserve.node.docker_spec import container_spec
    from hloserve.node.node_config import NodeConfig
    from hloserve.node.plan import WorkerPlan, gateway_config, plan_workers
    from hloserve.node.serve_options import node_server_options
    from hloserve.node.triton_options import server_flags

    def tritonserver_flags(config: NodeConfig, worker: WorkerPlan, key: str) -> list[str]:
        return server_flags(node_server_options(config, worker, key))

    for launcher in ("tritonserver", "hloserve"):
        config = NodeConfig.model_validate(
            {
                "repository": tmp_path,
                "cpu_workers": 2,
                "docker": {"launcher": launcher},
                "tritonserver": {"model_control_mode": "explicit", "load_models": ["*"]},
            }
        )
        plan = plan_workers(config)
        flags = tritonserver_flags(config, plan[0], KEY)
        assert set(restricted_flags(KEY)) <= set(flags)
        spec = container_spec(config, plan[0], KEY)
        if launcher == "tritonserver":
            assert set(restricted_flags(KEY)) <= set(spec["command"])
            assert ENV_KEY not in spec["environment"]
        else:
            assert spec["environment"][ENV_KEY] == KEY
            assert not [a for a in spec["command"] if KEY in a]
        key = gateway_config(config, plan, KEY).upstream.model_control_key
        assert key.get_secret_value() == KEY
    default = NodeConfig.model_validate({"repository": tmp_path, "cpu_workers": 1})
    worker = plan_workers(default)[0]  # node up's default is serve's: explicit, restricted
    assert set(restricted_flags(KEY)) | {"--load-model=*"} <= set(
        tritonserver_flags(default, worker, KEY)
    )
    none = default.model_copy(
        update={
            "tritonserver": default.tritonserver.model_copy(update={"model_control_mode": "none"})
        }
    )
    assert not [f for f in tritonserver_flags(none, worker, KEY) if "restricted" in f]


@pytest.mark.tritonserver
@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_a_load_without_the_key_is_refused_and_the_watchdog_reload_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host: str
) -> None:
    grpcclient = pytest.importorskip("tritonclient.grpc")
    httpclient = pytest.importorskip("tritonclient.http")
    from tritonclient.utils import InferenceServerException

    from tests.node.test_serve_cli import start_serve, stop_serve, stub_pids, wait_for_line

    monkeypatch.setenv(ENV_KEY, KEY)
    proc, log, grpc = start_serve(tmp_path, "--host", host)
    try:
        pid_line = wait_for_line(log, r"tritonserver \(pid (\d+)\)", proc, 60)
        server_pid = int(re.findall(r"\d+", pid_line)[0])
        http_line = wait_for_line(log, r"HTTP +http://\S+", proc, 10)
        http_port = int(http_line.rsplit(":", 1)[1])
        wait_for_line(log, r"hloserve: ready after", proc, 240)
        # Clients reach the server over loopback only, whatever address it binds.
        http = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")
        with pytest.raises(InferenceServerException, match="restricted") as refused:
            http.load_model("affine")
        assert refused.value.status() == "403"
        with pytest.raises(InferenceServerException, match="restricted") as refused:
            client.unload_model("affine")
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
        with pytest.raises(InferenceServerException, match="restricted"):
            http.get_model_repository_index()
        index = http.get_model_repository_index(headers={HEADER: KEY})
        assert {m["name"]: m["state"] for m in index}["affine"] == "READY"
        assert client.is_model_ready("affine")  # inference-side APIs stay open

        front = stub_pids(server_pid, "affine")
        os.kill(front[0], signal.SIGKILL)
        wait_for_line(log, rf"model 'affine': Python backend stub pid {front[0]}", proc, 30)
        wait_for_line(log, r"model 'affine': reloaded", proc, 120)
        tensor = grpcclient.InferInput("x", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        for _ in range(6):
            assert client.infer("affine", [tensor]).as_numpy("y").shape == (1, 3)
        assert front[0] not in stub_pids(server_pid, "affine")
        assert KEY not in log.read_text()  # the key is not printed
        http.close()
        client.close()
    finally:
        stop_serve(proc)
