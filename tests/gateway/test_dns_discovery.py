"""The gateway finds its workers by DNS (issue 31): a real DNS server on loopback (dnslib's)
answers the workers' name with the addresses of real tritonservers on several loopback
addresses; the fleet follows the answer as it changes, with no failed request.

The resolution itself (:func:`hloserve.gateway.discovery.resolve_workers`, dnspython) and the
settings are checked against the same server without tritonserver.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hloserve.errors import GatewayConfigError, UnavailableError
from hloserve.gateway.config import DiscoveryConfig, GatewayConfig, load_config
from hloserve.gateway.discovery import resolve_workers, with_workers

dnslib = pytest.importorskip("dnslib")
from dnslib.server import BaseResolver, DNSLogger, DNSServer  # noqa: E402

NAME = "hloserve-workers.hloserve.svc.cluster.local."


class Answers(BaseResolver):
    """A records of :data:`NAME`, changed by the test; any other name: NXDOMAIN."""

    def __init__(self) -> None:
        self.addresses: tuple[str, ...] = ()
        self.asked = 0

    def resolve(self, request: Any, handler: Any) -> Any:
        self.asked += 1
        reply = request.reply()
        if str(request.q.qname) != NAME:
            reply.header.rcode = dnslib.RCODE.NXDOMAIN
        elif request.q.qtype == dnslib.QTYPE.A:
            for address in self.addresses:
                reply.add_answer(
                    dnslib.RR(request.q.qname, dnslib.QTYPE.A, rdata=dnslib.A(address), ttl=1)
                )
        return reply


@pytest.fixture
def dns() -> Iterator[tuple[Answers, str]]:
    """(the answers, host:port of the DNS server) on 127.0.0.1, a free UDP port."""
    answers = Answers()
    server = DNSServer(
        answers, address="127.0.0.1", port=0, logger=DNSLogger(prefix=False, logf=lambda _: None)
    )
    server.start_thread()
    try:
        yield answers, f"127.0.0.1:{server.server.server_address[1]}"
    finally:
        server.stop()
        server.server.server_close()  # dnslib's stop() leaves the socket open


def _discovery(nameserver: str, **more: Any) -> DiscoveryConfig:
    return DiscoveryConfig(dns_name=NAME, dns_nameserver=nameserver, **more)


def test_resolution_follows_the_dns_answer(dns: tuple[Answers, str]) -> None:
    answers, nameserver = dns
    discovery = _discovery(nameserver)
    answers.addresses = ("127.0.0.3", "127.0.0.10", "127.0.0.2")
    assert asyncio.run(resolve_workers(discovery, 5.0)) == ("127.0.0.2", "127.0.0.3", "127.0.0.10")
    answers.addresses = ()  # the Service exists, no pod
    assert asyncio.run(resolve_workers(discovery, 5.0)) == ()
    other = discovery.model_copy(update={"dns_name": "nothing.hloserve.test."})
    assert asyncio.run(resolve_workers(other, 5.0)) == ()  # NXDOMAIN: no worker
    assert answers.asked == 3


def test_no_nameserver_answering_is_unavailable() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:  # bound, never answers
        silent.bind(("127.0.0.1", 0))
        discovery = _discovery(f"127.0.0.1:{silent.getsockname()[1]}")
        with pytest.raises(UnavailableError, match=f"DNS discovery of {NAME} at 127.0.0.1:"):
            asyncio.run(resolve_workers(discovery, 0.5))


def test_discovered_workers_take_the_configured_ports() -> None:
    config = GatewayConfig(
        discovery=DiscoveryConfig(dns_name=NAME, worker_grpc_port=9001, worker_http_port=9000)
    )
    fleet = with_workers(config, ("10.0.0.1", "fd00::2"))
    assert fleet.workers == ("10.0.0.1:9001", "[fd00::2]:9001")
    assert fleet.worker_http == ("10.0.0.1:9000", "[fd00::2]:9000")
    assert fleet.worker_metrics == ("10.0.0.1:8002", "[fd00::2]:8002")
    no_metrics = config.model_copy(
        update={"discovery": config.discovery.model_copy(update={"worker_metrics_port": 0})}
    )
    assert with_workers(no_metrics, ("10.0.0.1",)).worker_metrics == ()


def test_dns_discovery_settings_are_checked(tmp_path: Path) -> None:
    environ = {"HLOSERVE_GATEWAY_DISCOVERY__DNS_NAME": NAME}
    assert load_config(None, environ).discovery.dns_name == NAME
    with pytest.raises(GatewayConfigError, match=r"discovery\.dns_name .* leave workers empty"):
        load_config(None, environ | {"HLOSERVE_GATEWAY_WORKERS": "127.0.0.1:8001"})
    with pytest.raises(GatewayConfigError, match=r"at least one worker, or discovery\.dns_name"):
        load_config(None, {"HLOSERVE_GATEWAY_LISTEN": "127.0.0.1:8001"})
    bad = environ | {"HLOSERVE_GATEWAY_DISCOVERY__DNS_NAMESERVER": "127.0.0.1"}
    with pytest.raises(GatewayConfigError, match="expected host:port"):
        load_config(None, bad)


def _same_free_ports(hosts: tuple[str, ...], count: int) -> list[int]:
    """``count`` TCP ports free on every one of ``hosts`` (each worker binds its own address,
    all on the same ports, as pods behind one Service)."""
    for _ in range(50):
        with ExitStack() as stack:
            first = stack.enter_context(socket.socket())
            first.bind((hosts[0], 0))
            port = first.getsockname()[1]
            ports = [port + i for i in range(count)]
            try:
                for host in hosts:
                    for p in ports:
                        if (host, p) == (hosts[0], port):
                            continue  # ``first`` holds it
                        s = stack.enter_context(socket.socket())
                        s.bind((host, p))
            except OSError:
                continue
            return ports
    raise RuntimeError(f"no {count} consecutive ports free on {hosts}")


class Load:
    """Infer ``affine`` through the gateway in a loop (a thread), counting failures."""

    def __init__(self, address: str) -> None:
        import tritonclient.grpc as grpcclient

        self.client = grpcclient.InferenceServerClient(address)
        self.x = np.arange(8, dtype=np.float32).reshape(2, 4)
        self.expected: np.ndarray | None = None
        self.sent = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def one(self) -> np.ndarray:
        import tritonclient.grpc as grpcclient

        tensor = grpcclient.InferInput("x", [2, 4], "FP32")
        tensor.set_data_from_numpy(self.x)
        result: np.ndarray = self.client.infer("affine", [tensor], client_timeout=30).as_numpy("y")
        return result

    def _run(self) -> None:
        deadline = time.monotonic() + 300  # bounded: the test stops it long before
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                y = self.one()
                if self.expected is not None and not np.array_equal(y, self.expected):
                    self.failures.append(f"wrong answer {y}")
            except Exception as exc:
                self.failures.append(str(exc))
            self.sent += 1
            time.sleep(0.01)

    def start(self) -> None:
        self.expected = self.one()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def _successes(server: Any) -> int:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.urls.grpc)
    stats = client.get_inference_statistics("affine")
    count: int = stats.model_stats[0].inference_stats.success.count
    return count


def _wait(what: str, condition: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what}")
        time.sleep(0.2)


@pytest.mark.tritonserver
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_fleet_follows_the_dns_answer_without_failed_requests(
    dns: tuple[Answers, str], tmp_path: Path
) -> None:
    pytest.importorskip("tritonclient.grpc")
    from hloserve.model_repository_tools.build import build_repository
    from hloserve.node.gateway_thread import GatewayThread
    from hloserve.node.tritonserver import TritonServer
    from tests.conftest import GOLDEN, serving_options

    answers, nameserver = dns
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    shutil.copytree(GOLDEN / "affine", bundles / "affine")
    repo = tmp_path / "repository"
    build_repository(bundles, repo)
    hosts = ("127.0.0.2", "127.0.0.3", "127.0.0.4")  # three "pods", one Service
    http, grpc, metrics = _same_free_ports(hosts, 3)
    base = serving_options(repo)

    def options(host: str) -> Any:
        return dataclasses.replace(
            base, host=host, http_port=http, grpc_port=grpc, metrics_port=metrics
        )

    with ExitStack() as stack:
        a, b = (stack.enter_context(TritonServer(options(h))) for h in hosts[:2])
        answers.addresses = hosts[:2]
        config = GatewayConfig(
            discovery=_discovery(
                nameserver,
                dns_interval_seconds=0.5,
                worker_grpc_port=grpc,
                worker_http_port=http,
                worker_metrics_port=metrics,
            ),
        )
        update = {"listen": "127.0.0.1:0", "admin_port": 0, "http_listen": "127.0.0.1:0"}
        gateway = GatewayThread(config.model_copy(update=update))
        stack.callback(gateway.close)
        load = Load(f"127.0.0.1:{gateway.port}")
        load.start()
        stack.callback(load.stop)
        _wait("both workers serve", lambda: _successes(a) > 0 and _successes(b) > 0)

        # a worker joins: started, then published by DNS; it takes its share
        c = stack.enter_context(TritonServer(options(hosts[2])))
        answers.addresses = hosts
        published = time.monotonic()
        _wait("the new worker takes requests", lambda: _successes(c) > 5)
        joined_s = time.monotonic() - published

        # a worker leaves: DNS stops naming it first (a pod going away leaves the Service's
        # endpoints before it stops); once it takes no more requests it stops
        answers.addresses = (hosts[0], hosts[2])
        withdrawn = time.monotonic()
        state = {"count": _successes(b), "since": time.monotonic()}

        def b_drained() -> bool:
            now = _successes(b)
            if now != state["count"]:
                state.update(count=now, since=time.monotonic())
            return time.monotonic() - state["since"] > 3.0

        _wait("the departed worker takes no more requests", b_drained)
        b.stop()
        before = (_successes(a), _successes(c))
        time.sleep(3.0)  # the remaining fleet serves on, the stopped worker is not asked
        after = (_successes(a), _successes(c))
        assert after[0] > before[0] and after[1] > before[1], (before, after)
        load.stop()
        assert load.failures == [], load.failures[:5]
        assert load.sent > 50, load.sent
        left_s = state["since"] - withdrawn
        print(
            f"DNS discovery: a worker took 5 requests {joined_s:.1f} s after it was published, "
            f"the withdrawn one its last {left_s:.1f} s after; {load.sent} requests, 0 failed"
        )


def test_the_gateway_starts_before_any_worker_pod_has_an_address(
    dns: tuple[Answers, str],
) -> None:
    """A Service with no ready pod yet: the gateway serves (HAProxy without servers), answers
    /readyz 503 until a worker serves a model, and keeps resolving."""
    import urllib.error
    import urllib.request

    from hloserve.node.gateway_thread import GatewayThread

    answers, nameserver = dns
    config = GatewayConfig(discovery=_discovery(nameserver, dns_interval_seconds=0.2))
    update = {"listen": "127.0.0.1:0", "admin_port": 0, "http_listen": "127.0.0.1:0"}
    gateway = GatewayThread(config.model_copy(update=update))
    try:
        with pytest.raises(urllib.error.HTTPError) as unready:
            urllib.request.urlopen(f"http://127.0.0.1:{gateway.admin_port}/readyz", timeout=5)
        assert unready.value.code == 503
        unready.value.close()
        asked = answers.asked
        _wait("the gateway resolves again", lambda: answers.asked >= asked + 3, 10.0)
        assert gateway.is_running()
    finally:
        gateway.close()
