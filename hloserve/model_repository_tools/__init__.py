"""Bundles -> Triton model repository: configs, atomic writes, validation.

The layout and every field are fixed by docs/serving.md ("The generated model repository").
The strings the backends share live in :mod:`hloserve.names`, which
imports nothing else; so that importing it stays cheap inside Triton's stub processes, the
names below are imported from their modules on first use (PEP 562), and Triton's
``model_config_pb2`` (tritonclient) only when a config is built or parsed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hloserve.model_repository_tools.build import (
        RepositoryError,
        build_repository,
        write_repository,
    )
    from hloserve.model_repository_tools.config import (
        config_text,
        front_config,
        parse_config,
        parse_config_text,
        runtime_config,
    )
    from hloserve.model_repository_tools.repository_plan import (
        CONFIG_FILE,
        ExecutableCacheOptions,
        FrontModel,
        QueueOptions,
        RepositoryPlan,
        SchedulingOptions,
        WeightCacheOptions,
        check_names,
        plan_repository,
    )
    from hloserve.model_repository_tools.validate import validate_repository
    from hloserve.names import REPOSITORY_FORMAT, runtime_tensor_name

_WHERE = {
    "CONFIG_FILE": "repository_plan",
    "ExecutableCacheOptions": "repository_plan",
    "FrontModel": "repository_plan",
    "RepositoryError": "build",
    "RepositoryPlan": "repository_plan",
    "QueueOptions": "repository_plan",
    "SchedulingOptions": "repository_plan",
    "WeightCacheOptions": "repository_plan",
    "build_repository": "build",
    "check_names": "repository_plan",
    "plan_repository": "repository_plan",
    "write_repository": "build",
    "config_text": "config",
    "front_config": "config",
    "parse_config": "config",
    "parse_config_text": "config",
    "runtime_config": "config",
    "REPOSITORY_FORMAT": "names",
    "runtime_tensor_name": "names",
    "validate_repository": "validate",
}

__all__ = [
    "CONFIG_FILE",
    "REPOSITORY_FORMAT",
    "ExecutableCacheOptions",
    "FrontModel",
    "QueueOptions",
    "RepositoryError",
    "RepositoryPlan",
    "SchedulingOptions",
    "WeightCacheOptions",
    "build_repository",
    "check_names",
    "config_text",
    "front_config",
    "parse_config",
    "parse_config_text",
    "plan_repository",
    "runtime_config",
    "runtime_tensor_name",
    "validate_repository",
    "write_repository",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f"{__name__}.{_WHERE[name]}")
    return getattr(module, name)
