"""Gateway settings: defaults (ReactantServer's, docs/gateway.md), YAML, env overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from hloserve.errors import GRPC_CODE, Status
from hloserve.gateway.config import (
    MAX_GRPC_MESSAGE_BYTES,
    GatewayConfig,
    GatewayConfigError,
    load_config,
)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    return path


def test_defaults_follow_reactantserver(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, "workers: ['127.0.0.1:8101']\n"), environ={})
    assert config.listen == "127.0.0.1:8001"
    assert config.admin_port == 8002
    assert config.mode == "round_robin"  # ReactantServer's default mode
    s = config.scheduling
    assert s.default_replicas == 1  # replica counts
    assert s.forbid_memory_oversubscription is True  # placement
    assert s.hysteresis == 0.0  # placement
    assert s.rebalance_compute_seconds == 300.0  # repack cadence
    assert s.first_rebalance_compute_seconds == 60.0  # repack cadence
    assert s.routing_fill_factor == 1.0  # fill quantum
    assert s.routing_fill_mode == "run"  # fill mode
    assert config.discovery.poll_interval_seconds == 10.0  # discovery interval
    assert config.upstream.request_timeout_seconds == 60.0  # per-call timeout
    assert config.grpc.max_recv_msg_bytes == MAX_GRPC_MESSAGE_BYTES == 2**31 - 1
    assert config.grpc.max_send_msg_bytes == MAX_GRPC_MESSAGE_BYTES


def test_yaml_file_with_every_section(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """
listen: 127.0.0.1:9001
admin_port: 9002
workers: [127.0.0.1:8101, 127.0.0.1:8102]
mode: lpt_packing
scheduling:
  default_replicas: all
  hysteresis: 0.25
  routing_fill_mode: spread
  models:
    resnet: {replicas: 2, fill_mode: run, fill_factor: 2.0}
discovery: {poll_interval_seconds: 1.5}
upstream: {request_timeout_seconds: 5}
grpc: {max_recv_msg_bytes: 1048576}
""",
    )
    config = load_config(path, environ={})
    assert config.workers == ("127.0.0.1:8101", "127.0.0.1:8102")
    assert config.mode == "lpt_packing"
    s = config.scheduling
    assert s.default_replicas == "all"
    assert s.replicas_of("resnet") == 2
    assert s.replicas_of("other") == "all"
    assert s.fill_mode_of("resnet") == "run"
    assert s.fill_mode_of("other") == "spread"
    assert s.fill_factor_of("resnet") == 2.0
    assert s.fill_factor_of("other") == 1.0
    assert config.discovery.poll_interval_seconds == 1.5
    assert config.grpc.max_recv_msg_bytes == 1048576


def test_env_overrides_win_over_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "workers: ['127.0.0.1:8101']\nscheduling: {hysteresis: 0.1}\n")
    config = load_config(
        path,
        environ={
            "HLOSERVE_GATEWAY_MODE": "lpt_packing",
            "HLOSERVE_GATEWAY_SCHEDULING__HYSTERESIS": "0.5",
            "HLOSERVE_GATEWAY_SCHEDULING__DEFAULT_REPLICAS": "all",
            "HLOSERVE_GATEWAY_SCHEDULING__FORBID_MEMORY_OVERSUBSCRIPTION": "false",
            "HLOSERVE_GATEWAY_UPSTREAM__REQUEST_TIMEOUT_SECONDS": "2.5",
            "HLOSERVE_GATEWAY_WORKERS": "127.0.0.1:8201, 127.0.0.1:8202",
            "UNRELATED": "x",
        },
    )
    assert config.mode == "lpt_packing"
    assert config.scheduling.hysteresis == 0.5
    assert config.scheduling.default_replicas == "all"
    assert config.scheduling.forbid_memory_oversubscription is False
    assert config.upstream.request_timeout_seconds == 2.5
    assert config.workers == ("127.0.0.1:8201", "127.0.0.1:8202")


def test_env_only_config() -> None:
    config = load_config(environ={"HLOSERVE_GATEWAY_WORKERS": "127.0.0.1:8101"})
    assert config.workers == ("127.0.0.1:8101",)


def test_env_replica_count_as_integer() -> None:
    config = load_config(
        environ={
            "HLOSERVE_GATEWAY_WORKERS": "127.0.0.1:8101",
            "HLOSERVE_GATEWAY_SCHEDULING__DEFAULT_REPLICAS": "3",
        }
    )
    assert config.scheduling.default_replicas == 3


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("HLOSERVE_GATEWAY_MOOD", "names no setting (mood)"),
        ("HLOSERVE_GATEWAY_SCHEDULING__HYSTERISIS", "names no setting (scheduling.hysterisis)"),
        ("HLOSERVE_GATEWAY_SCHEDULING", "scheduling is a section"),
        ("HLOSERVE_GATEWAY_MODE__X", "mode has no sub-keys"),
        ("HLOSERVE_GATEWAY_SCHEDULING__MODELS__A", "names no setting (scheduling.models)"),
    ],
)
def test_env_typos_are_errors(name: str, expected: str) -> None:
    with pytest.raises(GatewayConfigError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        load_config(environ={"HLOSERVE_GATEWAY_WORKERS": "127.0.0.1:8101", name: "1"})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("listen: 127.0.0.1:8001\n", "workers: give at least one worker, or discovery.dns_name"),
        ("workers: []\n", "workers: "),
        ("workers: [nohost]\n", "expected host:port"),
        ("workers: [a:1, a:1]\n", "duplicate worker endpoints: a:1"),
        ("workers: [a:1]\nmode: fastest\n", "mode: "),
        ("workers: [a:1]\nscheduling: {hysteresis: 1.0}\n", "scheduling.hysteresis: "),
        ("workers: [a:1]\nscheduling: {default_replicas: 0}\n", "positive integer or 'all'"),
        ("workers: [a:1]\nscheduling: {routing_fill_mode: fill}\n", "routing_fill_mode"),
        ("workers: [a:1]\nscheduling: {routing_fill_factor: 0}\n", "routing_fill_factor"),
        ("workers: [a:1]\nscheduling: {rebalance_compute_seconds: 0}\n", "rebalance_compute"),
        ("workers: [a:1]\nlisten: 127.0.0.1:0\n", "listen: expected host:port"),
        ("workers: [a:1]\ncolour: red\n", "colour: unknown key"),
        ("- a\n", "expected a mapping"),
        ("workers: [a:1]\ngrpc: {max_recv_msg_bytes: 4294967296}\n", "max_recv_msg_bytes"),
    ],
)
def test_bad_files_name_the_key(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(GatewayConfigError, match=expected) as info:
        load_config(_write(tmp_path, text), environ={})
    assert GRPC_CODE[info.value.status] == GRPC_CODE[Status.INVALID_ARGUMENT]


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(GatewayConfigError, match="cannot read it"):
        load_config(tmp_path / "absent.yaml", environ={})


def test_config_is_frozen() -> None:
    config = GatewayConfig(workers=("127.0.0.1:8101",))
    with pytest.raises(ValueError, match="frozen"):
        config.mode = "lpt_packing"  # type: ignore[misc]


def test_worker_metrics_one_per_worker() -> None:
    config = load_config(
        environ={
            "HLOSERVE_GATEWAY_WORKERS": "127.0.0.1:8101,127.0.0.1:8201",
            "HLOSERVE_GATEWAY_WORKER_METRICS": "127.0.0.1:8103,127.0.0.1:8203",
        }
    )
    assert config.worker_metrics == ("127.0.0.1:8103", "127.0.0.1:8203")
    with pytest.raises(GatewayConfigError, match="names 1 endpoints for 2 workers"):
        load_config(
            environ={
                "HLOSERVE_GATEWAY_WORKERS": "127.0.0.1:8101,127.0.0.1:8201",
                "HLOSERVE_GATEWAY_WORKER_METRICS": "127.0.0.1:8103",
            }
        )


def test_docs_example_config_matches_the_code() -> None:
    """docs/gateway.md's YAML block loads, shows the real defaults, and its worker ports are
    the ones `hloserve serve --workers 2` (base 8100) gives its workers."""
    import re

    import yaml

    from hloserve.gateway.config import GatewayConfig
    from hloserve.node.plan import worker_ports

    text = (Path(__file__).parents[2] / "docs" / "gateway.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", text, re.DOTALL)
    assert block is not None
    values = yaml.safe_load(block.group(1))
    config = GatewayConfig.model_validate(values)
    ports = worker_ports(2, 8100)
    assert config.workers == tuple(f"127.0.0.1:{p.grpc}" for p in ports)
    assert config.worker_metrics == tuple(f"127.0.0.1:{p.metrics}" for p in ports)
    defaults = GatewayConfig(workers=config.workers).model_dump()
    shown = config.model_dump()
    assert config.worker_http == tuple(f"127.0.0.1:{p.http}" for p in ports)
    for key in (
        "listen",
        "admin_port",
        "mode",
        "discovery",
        "upstream",
        "grpc",
        "health",
        "tls",
    ):
        assert shown[key] == defaults[key], key
    assert shown["admission"] == defaults["admission"]
    scheduling = {k: v for k, v in shown["scheduling"].items() if k != "models"}
    assert scheduling == {k: v for k, v in defaults["scheduling"].items() if k != "models"}


def test_tls_and_http_settings_are_checked(tmp_path: Path) -> None:
    from hloserve.gateway.config import GatewayConfig, GatewayConfigError, with_tls

    config = GatewayConfig(workers=("h:1",))
    assert with_tls(config, None, None) is config
    with pytest.raises(GatewayConfigError, match="--tls-cert and --tls-key go together"):
        with_tls(config, tmp_path / "c.pem", None)
    tls = with_tls(config, tmp_path / "c.pem", tmp_path / "k.pem").tls
    assert tls is not None and tls.cert == tmp_path / "c.pem" and tls.client_ca is None
    with pytest.raises(ValueError, match="http_listen needs worker_http"):
        GatewayConfig(workers=("h:1",), http_listen="127.0.0.1:8000")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "data_plane: python\n",
            "data_plane was removed: HAProxy is the only data plane",
        ),
        (
            "admission: {max_inflight_items_per_model: 4}\n",
            "admission: max_inflight_items_per_model was removed: HAProxy counts requests, not"
            " items: use admission.max_inflight_requests_per_worker",
        ),
        (
            "scheduling: {routing_policy: fill_rr}\n",
            "scheduling: routing_policy was removed: HAProxy's balance algorithm follows"
            " routing_fill_mode",
        ),
    ],
)
def test_keys_of_the_removed_python_data_plane_are_refused_naming_what_to_use(
    tmp_path: Path, text: str, expected: str
) -> None:
    with pytest.raises(GatewayConfigError) as info:
        load_config(_write(tmp_path, "workers: [a:1]\n" + text), environ={})
    assert expected in str(info.value)
