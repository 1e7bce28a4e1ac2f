"""Bundles -> Triton model repository: configs, atomic writes, validation.

The layout and every field are fixed by docs/serving.md ("The generated model repository").
The strings the backends share live in :mod:`hloserve.names`, which
imports nothing else; so that importing it stays cheap inside Triton's stub processes, the
names below are imported from their modules on first use (PEP 562), and Triton's
``model_config_pb2`` (tritonclient) only when a config is built or parsed.

Modules:
    repository_plan: bundles directory -> a validated plan of the repository, nothing written.
    build: write a plan atomically (:func:`build_repository`, :func:`write_repository`).
    config: ``config.pbtxt`` of the front and runtime models as ``ModelConfig`` messages.
    batch_sizes: the compiled batch sizes of symbolic-batch bundles.
    foreign: Triton models of other backends beside the bundles.
    validate: check a generated repository against its bundles.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hloserve.errors import RepositoryError
    from hloserve.model_repository_tools.build import build_repository, write_repository
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
    "CONFIG_FILE": "hloserve.model_repository_tools.repository_plan",
    "ExecutableCacheOptions": "hloserve.model_repository_tools.repository_plan",
    "FrontModel": "hloserve.model_repository_tools.repository_plan",
    "RepositoryError": "hloserve.errors",
    "RepositoryPlan": "hloserve.model_repository_tools.repository_plan",
    "QueueOptions": "hloserve.model_repository_tools.repository_plan",
    "SchedulingOptions": "hloserve.model_repository_tools.repository_plan",
    "WeightCacheOptions": "hloserve.model_repository_tools.repository_plan",
    "build_repository": "hloserve.model_repository_tools.build",
    "check_names": "hloserve.model_repository_tools.repository_plan",
    "plan_repository": "hloserve.model_repository_tools.repository_plan",
    "write_repository": "hloserve.model_repository_tools.build",
    "config_text": "hloserve.model_repository_tools.config",
    "front_config": "hloserve.model_repository_tools.config",
    "parse_config": "hloserve.model_repository_tools.config",
    "parse_config_text": "hloserve.model_repository_tools.config",
    "runtime_config": "hloserve.model_repository_tools.config",
    "REPOSITORY_FORMAT": "hloserve.names",
    "runtime_tensor_name": "hloserve.names",
    "validate_repository": "hloserve.model_repository_tools.validate",
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
    module = importlib.import_module(_WHERE[name])
    return getattr(module, name)
