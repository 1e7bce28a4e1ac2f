"""Bundles -> Triton model repository: configs, atomic writes, validation.

The layout and every field are fixed by docs/serving.md ("The generated model repository").
The strings the backends share live in :mod:`hloserve.names`, which
imports nothing else; so that importing it stays cheap inside Triton's stub processes, the
names below are imported from their modules on first use (PEP 562), and Triton's
``model_config_pb2`` (tritonclient) only when a config is built or parsed.

Modules:
    build_options: :class:`BuildOptions`, every option that shapes a repository, with its flags.
    repository_plan: bundles directory -> a validated plan of the repository, nothing written.
    build: write a plan atomically (:func:`build_repository`, :func:`write_repository`).
    config: ``config.pbtxt`` of the front and runtime models as ``ModelConfig`` messages.
    batch_sizes: the compiled batch sizes of symbolic-batch bundles.
    foreign: Triton models of other backends beside the bundles.
    validate: check a generated repository against its bundles.
"""

# ruff: noqa: F401 (the names re-exported on first use)
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names of __all__, for type checkers
    from hloserve.errors import RepositoryError
    from hloserve.model_repository_tools.build import build_repository, write_repository
    from hloserve.model_repository_tools.build_options import (
        BatchSizeOptions,
        BuildOptions,
        ExecutableCacheOptions,
        QueueOptions,
        SchedulingOptions,
        WeightCacheOptions,
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
        FrontModel,
        RepositoryPlan,
        check_names,
        plan_repository,
    )
    from hloserve.model_repository_tools.validate import validate_repository
    from hloserve.names import REPOSITORY_FORMAT, runtime_tensor_name

_MODULES = {
    "hloserve.errors": ("RepositoryError",),
    "hloserve.model_repository_tools.build": ("build_repository", "write_repository"),
    "hloserve.model_repository_tools.config": (
        "config_text",
        "front_config",
        "parse_config",
        "parse_config_text",
        "runtime_config",
    ),
    "hloserve.model_repository_tools.build_options": (
        "BatchSizeOptions",
        "BuildOptions",
        "ExecutableCacheOptions",
        "QueueOptions",
        "SchedulingOptions",
        "WeightCacheOptions",
    ),
    "hloserve.model_repository_tools.repository_plan": (
        "CONFIG_FILE",
        "FrontModel",
        "RepositoryPlan",
        "check_names",
        "plan_repository",
    ),
    "hloserve.model_repository_tools.validate": ("validate_repository",),
    "hloserve.names": ("REPOSITORY_FORMAT", "runtime_tensor_name"),
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    """Import ``name`` from its module on first use (PEP 562)."""
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
