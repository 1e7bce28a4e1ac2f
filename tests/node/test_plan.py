"""Pure parts of the node's plan and process runtime: restart policy, backoff, exit text, wait."""

from __future__ import annotations

import threading
import time

import pytest

from hloserve.errors import TritonServerError
from hloserve.node.node_config import RestartConfig
from hloserve.node.plan import describe_exit, restart_allowed
from hloserve.node.process_runtime import (
    RESTART_BACKOFF_MAX_S,
    restart_delay,
    wait_all_ready,
)


@pytest.mark.parametrize(
    ("policy", "max_retries", "code", "restarts", "allowed"),
    [
        ("no", 5, 1, 0, False),
        ("always", 5, 0, 100, True),
        ("unless-stopped", 5, 0, 100, True),
        ("on-failure", 5, 0, 0, False),  # a clean exit stays down
        ("on-failure", 5, 1, 4, True),
        ("on-failure", 5, -9, 4, True),  # a kill is a failure
        ("on-failure", 5, 1, 5, False),  # retries spent
        ("on-failure", 0, 1, 10**6, True),  # 0 = unlimited
    ],
)
def test_restart_policy_as_docker_reads_it(
    policy: str, max_retries: int, code: int, restarts: int, allowed: bool
) -> None:
    config = RestartConfig.model_validate({"policy": policy, "max_retries": max_retries})
    assert restart_allowed(config, code, restarts) is allowed


def test_restart_backoff_doubles_from_100_ms_up_to_a_minute() -> None:
    assert [restart_delay(n) for n in range(4)] == [0.1, 0.2, 0.4, 0.8]
    assert restart_delay(30) == RESTART_BACKOFF_MAX_S == 60.0


def test_exit_description_names_the_signal_or_the_code() -> None:
    assert describe_exit(-9) == "was killed by SIGKILL"
    assert describe_exit(3) == "exited with code 3"


class _NeverReady:
    def __init__(self) -> None:
        self.calls = 0

    def wait_ready(self, timeout_s: float) -> float:
        self.calls += 1
        time.sleep(min(timeout_s, 0.05))
        raise TritonServerError("not ready yet")

    def is_running(self) -> bool:
        return True


def test_wait_all_ready_returns_none_when_stopped() -> None:
    server, stop = _NeverReady(), threading.Event()
    threading.Timer(0.3, stop.set).start()
    assert wait_all_ready([server], 60.0, stop) is None  # type: ignore[list-item]
    assert server.calls >= 2  # it kept polling until the stop


def test_wait_all_ready_raises_when_a_server_exits() -> None:
    server = _NeverReady()
    server.is_running = lambda: False  # type: ignore[method-assign]
    with pytest.raises(TritonServerError, match="not ready yet"):
        wait_all_ready([server], 60.0)  # type: ignore[list-item]
    assert server.calls == 1
