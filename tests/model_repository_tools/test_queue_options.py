"""``--max-queue-size`` -> ``QueueOptions`` -> the front's ``default_queue_policy`` (issue 28)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hloserve import names
from hloserve.cli_options import queue_options
from hloserve.errors import InvalidArgumentError, RepositoryError
from hloserve.model_repository_tools.build_options import QueueOptions
from hloserve.model_repository_tools.config import parse_config_text
from hloserve.model_repository_tools.repository_plan import plan_repository
from tests.conftest import needs_tritonclient


def test_values_parse_into_one_typed_option() -> None:
    assert queue_options(["8", "tiny=2"]) == QueueOptions(max_queue_size=8, per_model={"tiny": 2})
    assert queue_options([]) == QueueOptions()
    for bad in (["x"], ["4", "5"], ["m=1", "m=2"]):
        with pytest.raises(InvalidArgumentError):
            queue_options(bad)


def _queue(plan: object, name: str) -> object:
    model = next(m for m in plan.models if m.name == name)  # type: ignore[attr-defined]
    return parse_config_text(model.config_text).dynamic_batching.default_queue_policy


@needs_tritonclient
def test_the_plan_writes_the_default_the_global_and_the_per_model_bound(
    tiny_bundle: Path,
) -> None:
    bundles = tiny_bundle.parent

    def config(**kwargs: object) -> object:
        model = next(m for m in plan_repository(bundles, **kwargs).models if m.name == "tiny")
        return parse_config_text(model.config_text)

    # the default: two front instances and the default bound, max(128, 16 x the largest
    # batch 4), with queue deadlines (two: tritonserver 2.51's one-instance ~500 ms stall)
    default = config()
    assert [g.count for g in default.instance_group] == [names.DEFAULT_FRONT_INSTANCES] == [2]
    policy = default.dynamic_batching.default_queue_policy
    assert (policy.max_queue_size, policy.allow_timeout_override) == (128, True)
    assert policy.default_timeout_microseconds == names.QUEUE_TIMEOUT_US
    # a bound asked for: the default two instances keep it
    asked = config(queue=QueueOptions(per_model={"tiny": 3}))
    assert [g.count for g in asked.instance_group] == [2]
    assert asked.dynamic_batching.default_queue_policy.max_queue_size == 3
    # one instance asked for: no policy (the stall), the queue unbounded as Triton's default
    lean = config(front_instances=1)
    assert [g.count for g in lean.instance_group] == [1]
    assert not lean.dynamic_batching.HasField("default_queue_policy")
    # one instance and a bound, both asked for: as asked
    one = config(front_instances=1, queue=QueueOptions(max_queue_size=3))
    assert [g.count for g in one.instance_group] == [1]
    assert one.dynamic_batching.default_queue_policy.max_queue_size == 3
    assert (
        _queue(
            plan_repository(bundles, queue=QueueOptions(max_queue_size=3)), "tiny"
        ).max_queue_size
        == 3
    )
    options = QueueOptions(max_queue_size=3, per_model={"tiny": 7})
    assert _queue(plan_repository(bundles, queue=options), "tiny").max_queue_size == 7


def test_bad_bounds_are_refused_naming_the_model(tiny_bundle: Path) -> None:
    for options, text in (
        (QueueOptions(per_model={"nope": 2}), "'nope', which is not a bundle"),
        (QueueOptions(per_model={"tiny": 0}), "of model 'tiny' must be >= 1"),
        (QueueOptions(max_queue_size=-1), "must be >= 0"),
    ):
        with pytest.raises(RepositoryError, match=text):
            plan_repository(tiny_bundle.parent, queue=options)
