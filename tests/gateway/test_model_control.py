"""The gateway's model-control decision alone (pure logic): which workers each step of a load
or unload goes to, in which order (hloserve/gateway/model_control.py; docs/gateway.md,
"Model control"). The workers' indexes and a meta's config are given, not asked for; real
tritonservers: tests/gateway/test_model_control_tritonserver.py."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

pytest.importorskip("tritonclient.grpc")

from hloserve.errors import FailedPreconditionError, HloserveError, Status
from hloserve.gateway.model_control import NAME_MAX, PATH_MAX, Action, ModelControl
from hloserve.gateway.routing import ModelRoute, Router, RoutingTable
from hloserve.names import RUNTIME_MODEL

WORKERS = ("w0", "w1", "w2")


class Given(ModelControl):
    """ModelControl over given indexes and meta configs; every step is recorded and each
    worker answers its index's changes (``refuse``: models a worker refuses to load)."""

    def __init__(
        self,
        indexes: Mapping[str, Mapping[str, str]],
        metas: Mapping[str, tuple[str, ...]] | None = None,
        table: RoutingTable | None = None,
        place: Any = None,
        refuse: Sequence[tuple[str, str]] = (),
    ) -> None:
        class Workers:  # what ModelControl reads of Upstreams here
            workers = WORKERS

        upstreams: Any = Workers()
        super().__init__(Router(table), upstreams, 1.0, None, place)
        self.given = {w: dict(i) for w, i in indexes.items()}
        self.metas = dict(metas or {})
        self.refuse = set(refuse)
        self.steps: list[tuple[str, str, tuple[str, ...]]] = []

    async def indexes(self) -> dict[str, dict[str, str]]:
        return {w: dict(i) for w, i in self.given.items()}

    async def meta_calls(self, model: str, worker: str) -> tuple[str, ...] | None:
        return self.metas.get(model, ())

    async def send(self, how: Action, name: str, workers: Sequence[str]) -> list[tuple[str, bool]]:
        self.steps.append((how, name, tuple(workers)))
        answers = []
        for w in workers:
            ok = (w, name) not in self.refuse
            if ok:
                self.given[w][name] = "READY" if how == "load" else "unloaded"
            answers.append((w, ok))
        return answers

    def run_one(self, action: Action, model: str, parameters: Sequence[str] = ()) -> Any:
        return asyncio.run(self.run(action, model, self.send, bool, parameters))


def test_a_held_model_goes_to_its_holders_and_an_unloaded_row_is_not_held() -> None:
    control = Given({"w0": {"m": "READY"}, "w1": {"m": "unloaded"}, "w2": {"m": ""}})
    assert not control.run_one("load", "m").failed
    assert control.steps == [("load", "m", ("w0",))]
    control = Given({"w0": {"m": "UNAVAILABLE"}, "w1": {}, "w2": {"m": "LOADING"}})
    control.run_one("unload", "m")
    assert control.steps == [("unload", "m", ("w0", "w2"))]


def test_a_model_no_worker_holds_goes_where_its_repository_is_or_where_placed() -> None:
    control = Given({"w0": {"m": ""}, "w1": {}, "w2": {"m": "unloaded"}})
    control.run_one("load", "m")
    assert control.steps == [("load", "m", ("w0", "w2"))]  # not w1: not in its repository
    control = Given({"w0": {}, "w1": {}, "w2": {}})
    control.run_one("load", "nope")  # no repository has it: every worker answers for itself
    assert control.steps == [("load", "nope", WORKERS)]
    control.steps.clear()
    control.run_one("unload", "nope")
    assert control.steps == [("unload", "nope", WORKERS)]
    placed: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = []

    def place(model: str, calls: Sequence[str], candidates: Sequence[str]) -> Sequence[str]:
        placed.append((model, tuple(calls), tuple(candidates)))
        return candidates[-1:]

    control = Given({"w0": {"m": ""}, "w1": {"m": ""}, "w2": {}}, place=place)
    control.run_one("load", "m")
    assert placed == [("m", (), ("w0", "w1"))]
    assert control.steps == [("load", "m", ("w1",))]


def test_a_known_meta_goes_to_its_whole_group_callees_first() -> None:
    table = RoutingTable(
        {"a": ModelRoute(("w0", "w1")), "meta": ModelRoute(("w1",), calls=("a", "b"))}
    )
    indexes = {
        "w0": {"meta": "", "a": "READY", "b": "READY"},
        "w1": {"meta": "", "a": "READY", "b": ""},
        "w2": {"meta": "", "a": "", "b": ""},
    }
    control = Given(indexes, table=table)
    control.run_one("load", "meta")
    assert control.steps == [("load", "meta", ("w0",))]  # w0 holds the whole group
    indexes["w0"]["b"] = "unloaded"
    control = Given(indexes, table=table, place=lambda m, calls, cands: cands[-1:])
    assert not control.run_one("load", "meta").failed
    assert control.steps == [  # no whole group: placed with it, callees first, in order
        ("load", "a", ("w2",)),
        ("load", "b", ("w2",)),
        ("load", "meta", ("w2",)),
    ]


def test_a_never_seen_meta_is_read_then_moved_to_its_group() -> None:
    indexes = {
        "w0": {"meta": "", "a": ""},
        "w1": {"meta": "", "a": "READY"},
        "w2": {"meta": "", "a": ""},
    }
    control = Given(indexes, metas={"meta": ("a",)})
    outcome = control.run_one("load", "meta")
    assert not outcome.failed
    assert control.steps == [
        ("load", "meta", WORKERS),  # where a plain model goes: its config names its callees
        ("unload", "meta", ("w0", "w2")),  # only w1 holds its callee
    ]
    assert control.given["w1"]["meta"] == "READY" and control.given["w0"]["meta"] == "unloaded"
    assert control.known_calls("meta") == ("a",)  # the next load knows its group


def test_a_refused_callee_stops_the_load_and_is_the_answer() -> None:
    table = RoutingTable({"meta": ModelRoute(("w0",), calls=("a", "b"))})
    indexes = {w: {"meta": "", "a": "", "b": ""} for w in WORKERS}
    control = Given(indexes, table=table, refuse=[("w0", "a")])
    outcome = control.run_one("load", "meta")
    assert outcome.failed and ("w0", False) in outcome.answers
    assert control.steps == [("load", "a", WORKERS)]  # neither b nor the meta is sent


def test_unloading_the_runtime_is_refused_before_any_worker_and_loading_it_is_not() -> None:
    control = Given({"w0": {RUNTIME_MODEL: "READY"}, "w1": {RUNTIME_MODEL: "READY"}})
    with pytest.raises(FailedPreconditionError, match="hloserve's runtime"):
        control.run_one("unload", RUNTIME_MODEL)
    assert control.steps == []
    assert not control.run_one("load", RUNTIME_MODEL).failed
    assert control.steps == [("load", RUNTIME_MODEL, ("w0", "w1"))]


def test_an_over_long_file_override_is_refused_before_any_worker() -> None:
    """tritonserver 2.51 stops on a ``file:`` path it cannot create (std::filesystem "File
    name too long"): a component over NAME_MAX bytes (UTF-8 bytes, not characters) or a path
    over PATH_MAX is refused with INVALID_ARGUMENT naming the model, the parameter and the
    limit, in Triton's status and words for it (INTERNAL "failed to poll from model
    repository", what Triton's model-control examples expect); the limits themselves, other
    parameters and an unload go through."""
    control = Given({"w0": {"m": ""}, "w1": {"m": ""}})
    component = "file:1/" + "a" * (NAME_MAX + 1)
    with pytest.raises(HloserveError, match="path component of 256 bytes") as info:
        control.run_one("load", "m", ["config", component])
    assert info.value.status is Status.INTERNAL
    assert info.value.message.startswith("failed to load 'm', failed to poll from model repository")
    assert "'m'" in info.value.message and "file:1/aaa" in info.value.message
    assert "255 bytes per path component" in info.value.message
    wide = "file:" + "\u00e9" * 128  # 128 characters, 256 bytes
    with pytest.raises(HloserveError, match="256 bytes"):
        control.run_one("load", "m", [wide])
    path = "file:" + "/".join(["b" * 200] * 21)  # 4220 bytes, each component 200
    with pytest.raises(HloserveError, match=r"path of 4220 bytes.*4096"):
        control.run_one("load", "m", [path])
    assert control.steps == []
    at_limits = [
        "file:1/" + "a" * NAME_MAX,
        "file:" + "/".join(["c" * 255] * 16) + "/" + "d" * (PATH_MAX - 16 * 256),
        "config",
        "x" * 1000,  # not a file override: the workers judge it
    ]
    assert len(at_limits[1]) - len("file:") == PATH_MAX
    assert not control.run_one("load", "m", at_limits).failed
    assert control.steps == [("load", "m", ("w0", "w1"))]
    assert not control.run_one("unload", "m", [component]).failed  # unload: not looked at
