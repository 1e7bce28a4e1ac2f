"""``hloserve serve``'s option checks, load list and stub watchdog logic, without tritonserver."""

from __future__ import annotations

import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from hloserve.errors import InvalidArgumentError, PortInUseError, Status, TritonServerError
from hloserve.model_repository_tools.build_options import BuildOptions
from hloserve.node.plan import with_dependencies
from hloserve.node.process_runtime import wait_all_ready
from hloserve.node.serve_options import (
    ServeOptions,
    check_options,
    is_repository,
    serve_plan,
    server_options,
)
from hloserve.node.tritonserver import StubProcess
from hloserve.node.watchdog import StubWatchdog, describe_wait_status
from hloserve.ports import free_ports


def write_config(repo: Path, name: str, calls: str | None = None) -> None:
    (repo / name).mkdir(parents=True)
    text = f'name: "{name}"\n'
    if calls is not None:
        text += f'parameters {{ key: "hloserve.meta_calls" value {{ string_value: "{calls}" }} }}\n'
    (repo / name / "config.pbtxt").write_text(text)


def test_explicit_load_of_a_meta_loads_what_it_calls_transitively(tmp_path: Path) -> None:
    pytest.importorskip("tritonclient.grpc.model_config_pb2")  # reads config.pbtxt
    write_config(tmp_path, "cascade", "fast,outer")
    write_config(tmp_path, "outer", "slow,fast")  # a meta calling a meta
    write_config(tmp_path, "fast")
    write_config(tmp_path, "slow")
    write_config(tmp_path, "unrelated")
    write_config(tmp_path, "hloserve_runtime")
    options = ServeOptions(path=tmp_path, model_control_mode="explicit", load_models=("cascade",))
    loads = tuple(server_options(options, tmp_path).load_models)
    assert loads == ("cascade", "fast", "outer", "slow", "hloserve_runtime")
    assert with_dependencies(tmp_path, ["fast", "missing"]) == (
        "fast",
        "missing",
        "hloserve_runtime",
    )


def test_default_mode_is_explicit_loading_everything_on_every_host(tmp_path: Path) -> None:
    # Explicit on every host (issue 11): the repository API is restricted to a key instead.
    for host in ("127.0.0.1", "localhost", "::1", "0.0.0.0"):
        options = server_options(ServeOptions(path=tmp_path, host=host), tmp_path)
        assert (options.model_control_mode, tuple(options.load_models)) == ("explicit", ("*",))
        assert options.model_control_key is not None
    kept = server_options(ServeOptions(path=tmp_path, model_control_mode="none"), tmp_path)
    assert (kept.model_control_mode, tuple(kept.load_models)) == ("none", ())
    assert kept.model_control_key is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"host": "999.1.1.1"}, "cannot resolve host '999.1.1.1'"),
        (
            {"build": BuildOptions(front_instances=-1)},
            "--front-instances must be at least 0, got -1",
        ),
        (
            {"build": BuildOptions(max_request_bytes=0)},
            "--max-request-bytes must be at least 1, got 0",
        ),
        ({"http_port": 70000}, "HTTP port 70000 is not in 1..65535"),
        ({"workers": 2, "grpc_port": 70000}, "gateway gRPC port 70000 is not in 0..65535"),
        ({"load_models": ("x",)}, "--load-model needs --model-control-mode explicit"),
        (
            {"open_repository_api": True, "model_control_mode": "poll"},
            "--open-repository-api needs explicit model control, the default: with "
            "--model-control-mode poll tritonserver refuses every load and unload",
        ),
        ({"watch": True, "watch_interval_s": 0.0}, "--watch-interval must be above 0 seconds"),
        ({"watch": True, "model_control_mode": "poll"}, "leave out --model-control-mode"),
        (
            {"watch": True, "model_control_mode": "explicit", "load_models": ("x",)},
            "leave out --model-control-mode and --load-model",
        ),
        (
            {"tritonserver_args": ("--log-info=true", "--http-port=18050")},
            "--http-port after '--' would change what hloserve serve sets and watches: use "
            "hloserve serve's --http-port instead",
        ),
        (
            {"tritonserver_args": ("--grpc-address", "0.0.0.0")},
            "use hloserve serve's --host instead",
        ),
    ],
)
def test_bad_options_are_refused(tmp_path: Path, change: dict[str, object], message: str) -> None:
    http, grpc, metrics = free_ports(3)
    base = {"path": tmp_path, "http_port": http, "grpc_port": grpc, "metrics_port": metrics}
    with pytest.raises(InvalidArgumentError, match=message.replace(".", r"\.")) as info:
        check_options(ServeOptions(**{**base, **change}))  # type: ignore[arg-type]
    assert info.value.status is Status.INVALID_ARGUMENT


@pytest.mark.parametrize("busy", ["grpc_port", "metrics_port"])
def test_a_busy_gateway_port_is_refused_up_front(tmp_path: Path, busy: str) -> None:
    http, grpc, metrics = free_ports(3)
    ports = {"http_port": http, "grpc_port": grpc, "metrics_port": metrics}
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", ports[busy]))
        holder.listen()
        options = ServeOptions(path=tmp_path, workers=2, worker_port_base=0, **ports)  # type: ignore[arg-type]
        with pytest.raises(
            PortInUseError, match=f"gateway .*port 127.0.0.1:{ports[busy]} is already in use"
        ) as info:
            check_options(options)
    assert info.value.status is Status.UNAVAILABLE
    check_options(options)  # free again


def test_one_worker_is_direct_unless_the_repository_api_is_opened(tmp_path: Path) -> None:
    """One worker serves on the public ports (no gateway hop); ``--open-repository-api`` puts
    the gateway there, model control open (``auth.open_repository_api``), the worker on the
    worker ports keeping the key; with ``--workers 2`` the gateway's model control is open
    only with the opt-in."""
    http, grpc, metrics = free_ports(3)
    ports = {"http_port": http, "grpc_port": grpc, "metrics_port": metrics}
    base = ServeOptions(path=tmp_path, worker_port_base=0, **ports)  # type: ignore[arg-type]
    direct = serve_plan(base, tmp_path, [None])
    assert direct.gateway is None
    (server,) = direct.servers
    assert (server.http_port, server.grpc_port, server.metrics_port) == (http, grpc, metrics)
    assert server.model_control_key is not None
    opened = ServeOptions(path=tmp_path, worker_port_base=0, open_repository_api=True, **ports)  # type: ignore[arg-type]
    check_options(opened, [None])
    fronted = serve_plan(opened, tmp_path, [None])
    assert fronted.gateway is not None and fronted.gateway.auth.open_repository_api
    (worker,) = fronted.servers
    assert fronted.gateway.listen == f"127.0.0.1:{grpc}"
    assert fronted.gateway.http_listen == f"127.0.0.1:{http}"
    assert fronted.gateway.admin_port == metrics
    assert fronted.gateway.workers == (f"127.0.0.1:{worker.grpc_port}",)
    assert not {worker.http_port, worker.grpc_port, worker.metrics_port} & {http, grpc, metrics}
    assert worker.model_control_key is not None  # the gateway is the open door, not the worker
    assert fronted.gateway.upstream.model_control_key is not None
    assert fronted.gateway.upstream.model_control_key.get_secret_value() == (
        worker.model_control_key
    )
    two = serve_plan(base, tmp_path, [None, None])
    assert two.gateway is not None and not two.gateway.auth.open_repository_api
    two_open = serve_plan(opened, tmp_path, [None, None])
    assert two_open.gateway is not None and two_open.gateway.auth.open_repository_api


def test_gateway_settings_with_one_worker_need_the_opt_in(tmp_path: Path) -> None:
    """``--gateway-config`` and TLS configure the gateway: refused for one direct worker,
    accepted with ``--open-repository-api`` (a gateway in front)."""
    http, grpc, metrics = free_ports(3)
    ports = {"http_port": http, "grpc_port": grpc, "metrics_port": metrics}
    config = tmp_path / "gateway.yaml"
    config.write_text("mode: round_robin\n")
    for given in ({"gateway_config": config}, {"tls_cert": config, "tls_key": config}):
        with pytest.raises(InvalidArgumentError, match="or --open-repository-api"):
            check_options(ServeOptions(path=tmp_path, **ports, **given), [None])  # type: ignore[arg-type]
        opened = ServeOptions(
            path=tmp_path,
            worker_port_base=0,
            open_repository_api=True,
            **ports,
            **given,  # type: ignore[arg-type]
        )
        check_options(opened, [None])


def test_stub_process_from_proc() -> None:
    argv = ["/b/python/triton_python_backend_stub", "/repo/digits/1/model.py", "shm", "1", "1",
            "40", "/b/python", "336", "digits_0_1", "/b/hloserve_front"]  # fmt: skip
    running = StubProcess.from_proc(42, argv, "42 (triton_python_b) S 40 40 40 0 0")
    assert running == StubProcess(42, "digits", "1", "digits_0_1", None) and not running.dead
    zombie = StubProcess.from_proc(42, argv, "42 (triton_python_b) Z 40 40 40 0 0 9")
    assert zombie is not None and zombie.dead and zombie.wait_status == 9
    assert StubProcess.from_proc(7, ["/usr/bin/python3", "x.py"], "7 (python3) S 1 7 7") is None


def test_describe_wait_status() -> None:
    assert describe_wait_status(int(signal.SIGKILL)) == "signal 9, SIGKILL"
    assert describe_wait_status(3 << 8) == "exit code 3"


class FakeServer:
    """Stub lists a test controls (the watchdog's only view of a server)."""

    def __init__(self) -> None:
        self.stubs: list[StubProcess] = []

    def stub_processes(self) -> list[StubProcess]:
        return list(self.stubs)


def test_a_stub_reaped_before_the_next_check_is_not_a_death() -> None:
    server = FakeServer()
    lines: list[str] = []
    watchdog = StubWatchdog(server, lines.append, lines.append)  # type: ignore[arg-type]
    server.stubs = [StubProcess(5, "digits", "1", "digits_0_0", 0)]  # exiting on unload
    assert watchdog.check() == []
    server.stubs = []  # reaped by Triton
    assert watchdog.check() == [] and lines == []


def test_watchdog_reports_each_death_once_and_reloads_the_model() -> None:
    server = FakeServer()
    reloaded: list[str] = []
    lines: list[str] = []
    watchdog = StubWatchdog(server, reloaded.append, lines.append)  # type: ignore[arg-type]
    server.stubs = [
        StubProcess(5, "digits", "1", "digits_0_1", 9),
        StubProcess(6, "x", "1", "x_0_0"),
    ]
    assert watchdog.check() == []  # not yet: Triton may be about to reap it (an unload)
    assert [s.pid for s in watchdog.check()] == [5]
    watchdog.join()
    assert watchdog.check() == []  # the same zombie is not reported again
    watchdog.join()
    assert reloaded == ["digits"]
    assert lines == [
        "hloserve: model 'digits': Python backend stub pid 5 (digits_0_1) died "
        "(signal 9, SIGKILL); reloading",
        "hloserve: model 'digits': reloaded",
    ]


def test_watchdog_without_explicit_mode_only_reports() -> None:
    server = FakeServer()
    lines: list[str] = []
    watchdog = StubWatchdog(server, None, lines.append)  # type: ignore[arg-type]
    server.stubs = [StubProcess(5, "digits", "1", "digits_0_0", 3 << 8)]
    watchdog.check()
    watchdog.check()
    assert (
        len(lines) == 1 and "died (exit code 3)" in lines[0] and "--model-control-mode" in lines[0]
    )


def test_watchdog_reports_a_failed_reload() -> None:
    server = FakeServer()
    lines: list[str] = []

    def fail(model: str) -> None:
        raise RuntimeError(f"cannot load {model}")

    watchdog = StubWatchdog(server, fail, lines.append)  # type: ignore[arg-type]
    server.stubs = [StubProcess(5, "digits", "1", "digits_0_0", 9)]
    watchdog.check()
    watchdog.check()
    watchdog.join()
    assert lines[-1] == "hloserve: model 'digits': reload failed: cannot load digits"


def _cli_serve_options(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> ServeOptions:
    """The ServeOptions ``hloserve serve ARGV`` would run with (the CLI's own defaults)."""
    from hloserve import cli
    from hloserve.node import serve

    captured: list[ServeOptions] = []
    monkeypatch.setattr(serve, "run_serve", lambda options: captured.append(options) or 0)
    args = cli.build_parser().parse_args(["serve", *argv])
    args.func(args)
    return captured[0]


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--weight-cache-bytes", "100"], "--weight-cache-bytes applies"),
        (["--weight-cache-fraction", "0.5"], "--weight-cache-fraction applies"),
        (["--residency", "a=device"], "--residency applies"),
        (["--front-instances", "3", "--meta-concurrency", "1"], "--front-instances, --meta-"),
        (["--max-queue-delay-us", "0"], "--max-queue-delay-us applies"),
        (["--max-request-bytes", "1024"], "--max-request-bytes applies"),
        (["--compaction-interval", "4"], "--compaction-interval applies"),
        (["--executable-cache", "off"], "--executable-cache applies"),
        (["--executable-cache-bytes", "9"], "--executable-cache-bytes applies"),
    ],
)
def test_build_options_on_a_built_repository_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str], named: str
) -> None:
    write_config(tmp_path, "hloserve_runtime")
    ports = [str(p) for p in free_ports(3)]
    argv = [str(tmp_path), "--http-port", ports[0], "--grpc-port", ports[1]]
    argv += ["--metrics-port", ports[2]]
    check_options(_cli_serve_options(monkeypatch, argv))  # the CLI's defaults are not "set"
    with pytest.raises(InvalidArgumentError, match=named) as info:
        check_options(_cli_serve_options(monkeypatch, [*argv, *flags]))
    assert info.value.status is Status.INVALID_ARGUMENT
    assert "PATH is a bundles directory" in str(info.value)
    assert "hloserve repo build" in str(info.value)
    bundles = tmp_path / "bundles"
    (bundles / "m").mkdir(parents=True)  # not a repository: the flags apply
    check_options(_cli_serve_options(monkeypatch, [str(bundles), *argv[1:], *flags]))


class _SlowReadiness:
    """A server whose readiness check takes its slice plus ``extra_s``; ready at ``ready_on``."""

    def __init__(self, ready_on: int, extra_s: float) -> None:
        self.calls, self.ready_on, self.extra_s = 0, ready_on, extra_s

    def wait_ready(self, timeout_s: float) -> float:
        self.calls += 1
        if self.calls >= self.ready_on:
            time.sleep(0.05)
            return 0.05
        time.sleep(min(timeout_s, 0.3) + self.extra_s)
        raise TritonServerError("not ready yet")

    def is_running(self) -> bool:
        return True


def test_startup_wait_reports_the_time_it_really_took() -> None:
    """Each failed poll counts what it took, not a fixed 2 s."""
    server = _SlowReadiness(ready_on=4, extra_s=0.2)
    start = time.monotonic()
    waited = wait_all_ready([server], 60.0, threading.Event())  # type: ignore[list-item]
    real = time.monotonic() - start
    assert waited is not None and abs(waited - real) < 0.3, (waited, real)
    assert server.calls == 4


def test_startup_wait_gives_up_at_its_timeout() -> None:
    server = _SlowReadiness(ready_on=10**6, extra_s=0.5)
    start = time.monotonic()
    with pytest.raises(TritonServerError):
        wait_all_ready([server], 2.0, threading.Event())  # type: ignore[list-item]
    assert time.monotonic() - start < 2.0 + 1.0  # at most one slice past the timeout


def test_bundles_beside_configured_triton_models_are_a_source_to_build(tmp_path: Path) -> None:
    write_config(tmp_path, "plus_one")
    assert is_repository(tmp_path)  # Triton models only: served as they are
    (tmp_path / "digits").mkdir()
    (tmp_path / "digits" / "manifest.yaml").write_text("format_version: 1\n")
    assert not is_repository(tmp_path)  # a bundle among them: built first
    assert not is_repository(tmp_path / "missing")
