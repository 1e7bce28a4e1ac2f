"""Bundles -> Triton model repository (docs/serving.md, "The generated model repository").

Modules: build_options, repository_plan (validate and plan, nothing written), build (write a plan
atomically), config (``ModelConfig`` messages), batch_sizes, foreign (models of other backends),
validate (check a repository against its bundles). The names below are imported from their
modules on first use (PEP 562), so that Triton stubs importing one module stay light.
"""

# ruff: noqa: F401
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from hloserve.model_repository_tools.foreign import CONFIG_FILE
    from hloserve.model_repository_tools.repository_plan import (
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
    "hloserve.model_repository_tools.foreign": ("CONFIG_FILE",),
    "hloserve.model_repository_tools.repository_plan": (
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
