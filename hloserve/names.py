"""Names every layer shares: config.pbtxt parameters, model names, defaults.

Everyone imports these strings from here; standard library only (Triton stubs import it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

V = TypeVar("V")

#: Version of the generated repository layout (2: the channel; each front loads its own bundle).
REPOSITORY_FORMAT = 2
#: Oldest and newest repository format the backends accept (format 1 is refused: rebuild).
MIN_REPOSITORY_FORMAT = 2
MAX_REPOSITORY_FORMAT = 2

#: Triton ``backend:`` of every front model (one per bundle).
FRONT_BACKEND = "hloserve_front"
#: Triton ``backend:`` of the runtime model.
RUNTIME_BACKEND = "hloserve_runtime"
#: Model name of the single runtime model in a repository.
RUNTIME_MODEL = "hloserve_runtime"
#: Triton ``backend:`` of every meta model (docs/meta_models.md).
META_BACKEND = "hloserve_meta"

#: Model version directory the generator writes (Triton version "1").
MODEL_VERSION = "1"
#: Where a front model's bundle copy lives, relative to the model directory.
BUNDLE_SUBDIR = "1/bundle"
#: The front spec file (:mod:`hloserve.bundle.front_spec`), relative to the model directory.
FRONT_SPEC = "1/front_spec.json"
#: A front's Python model file, relative to the model directory: Triton infers the ``python``
#: backend from it when a load's config override names none (docs/serving.md, "Model control
#: mode"); the ordinary load does not read it.
FRONT_SHIM = "1/model.py"

# config.pbtxt parameters: docs/serving.md, "Config parameters", gives each one's form, default
# and writer.
PARAM_BUNDLE = "hloserve.bundle"
PARAM_RUNTIME_MODEL = "hloserve.runtime_model"
PARAM_MAX_REQUEST_BYTES = "hloserve.max_request_bytes"
PARAM_FRONT_INFLIGHT = "hloserve.front_inflight"
PARAM_RUNTIME_WAIT_S = "hloserve.runtime_wait_s"
PARAM_REPOSITORY_FORMAT = "hloserve.repository_format"
PARAM_META_CONCURRENCY = "hloserve.meta_concurrency"
PARAM_META_CALLS = "hloserve.meta_calls"
#: Runtime parameter of repository format 1 only: refused with a hint to rebuild.
PARAM_BUNDLES = "hloserve.bundles"
PARAM_WEIGHT_CACHE_BYTES = "hloserve.weight_cache_bytes"
PARAM_WEIGHT_CACHE_FRACTION = "hloserve.weight_cache_fraction"
PARAM_DEVICE_MEMORY_FRACTION = "hloserve.device_memory_fraction"
PARAM_RESIDENCY = "hloserve.residency"
PARAM_COMPACTION_INTERVAL = "hloserve.compaction_interval"
PARAM_EXECUTABLE_CACHE = "hloserve.executable_cache"
PARAM_EXECUTABLE_CACHE_BYTES = "hloserve.executable_cache_bytes"
PARAM_SCHEDULING = "hloserve.scheduling"
PARAM_MODEL_WEIGHTS = "hloserve.model_weights"
#: Foreign models' device memory hints; the runtime publishes them as
#: ``hloserve_weight_bytes{residency="foreign"}``, outside the weight cache's budget.
PARAM_FOREIGN_BYTES = "hloserve.foreign_memory_bytes"

#: Default of :data:`PARAM_FRONT_INFLIGHT`.
DEFAULT_FRONT_INFLIGHT = 0
#: Default of :data:`PARAM_RUNTIME_WAIT_S`, seconds.
DEFAULT_RUNTIME_WAIT_S = 120.0
#: CPU instances per stateless front model (docs/serving.md, "Front instances"): two, so that
#: its bounded queue never stalls (:data:`QUEUE_POLICY_MIN_INSTANCES`).
DEFAULT_FRONT_INSTANCES = 2
#: CPU instances per stateful front model: Triton's sequence batcher coalesces sequences only
#: within an instance (docs/serving.md, "Front instances").
STATEFUL_FRONT_INSTANCES = 1
#: Default of :data:`PARAM_MAX_REQUEST_BYTES`: 1 GiB.
DEFAULT_MAX_REQUEST_BYTES = 1 << 30
#: Default ``max_queue_size`` of a front, in largest compiled batches (docs/serving.md, "Queue
#: bounds and deadlines").
DEFAULT_QUEUE_BATCHES = 16
#: The default ``max_queue_size`` is never below this: twice the gateway's default admission.
DEFAULT_QUEUE_MIN = 128
#: Fewest front instances that get the default queue bound: tritonserver 2.51's dynamic
#: batcher, once a model has a queue policy, wakes for a new request only while an instance
#: waits for work, so with one instance a request arriving as that instance finishes waits
#: ~500 ms (docs/serving.md, "Queue bounds and deadlines").
QUEUE_POLICY_MIN_INSTANCES = 2
#: ``default_timeout_microseconds`` of a bounded front queue: 1 hour, so only a request's own
#: ``timeout`` expires it there.
QUEUE_TIMEOUT_US = 3_600_000_000
#: Default of :data:`PARAM_META_CONCURRENCY` (ReactantServer's ``REACTANT_META_CONCURRENCY``).
DEFAULT_META_CONCURRENCY = 2
#: Separator of the comma-separated parameter values.
BUNDLES_SEPARATOR = ","
#: Default of :data:`PARAM_DEVICE_MEMORY_FRACTION` (reasoning:
#: :func:`hloserve.triton_backend.runtime.device_memory.allocator_environment`).
DEFAULT_DEVICE_MEMORY_FRACTION = 0.9
#: :data:`PARAM_EXECUTABLE_CACHE` value (and ``--executable-cache`` argument) disabling it.
EXECUTABLE_CACHE_OFF = "off"
#: Residency values (ReactantServer ``residency``); the first is the default.
RESIDENCIES = ("system", "device", "unpinned")
#: Residency of a model :data:`PARAM_RESIDENCY` does not list.
DEFAULT_RESIDENCY = RESIDENCIES[0]
#: Scheduling disciplines (ReactantServer ``scheduler.discipline``); the first is the default.
SCHEDULING_DISCIPLINES = ("fair", "fifo", "edf")

#: Separator between bundle and tensor in the runtime's namespaced tensor names.
NAMESPACE_SEPARATOR = "__"


def runtime_tensor_name(bundle: str, tensor: str) -> str:
    """The runtime model's name for ``tensor`` of ``bundle``: ``"<bundle>__<tensor>"``."""
    return f"{bundle}{NAMESPACE_SEPARATOR}{tensor}"


def format_residency(residency: dict[str, str]) -> str:
    """:data:`PARAM_RESIDENCY` text: ``"a=device,b=unpinned"``, by model name, defaults left out."""
    return BUNDLES_SEPARATOR.join(
        f"{model}={value}"
        for model, value in sorted(residency.items())
        if value != DEFAULT_RESIDENCY
    )


def parse_residency(text: str) -> dict[str, str]:
    """Inverse of :func:`format_residency` (also accepts the default and spaces); ValueError
    for a malformed item, a model named twice, a residency not in :data:`RESIDENCIES`."""

    def residency(value: str) -> str:
        if value.lower() not in RESIDENCIES:
            raise ValueError(f"{value.lower()!r}, not one of {list(RESIDENCIES)}")
        return value.lower()

    return _parse_map(
        text, "residency item", "<residency>", "residency of model {!r} is", residency
    )


def format_model_weights(weights: dict[str, float]) -> str:
    """:data:`PARAM_MODEL_WEIGHTS` text: ``"a=3.0,b=0.5"``, by model name, 1.0 left out."""
    return BUNDLES_SEPARATOR.join(
        f"{model}={weight!r}" for model, weight in sorted(weights.items()) if weight != 1.0
    )


def parse_model_weights(text: str) -> dict[str, float]:
    """Inverse of :func:`format_model_weights` (also accepts spaces and weights of 1);
    ValueError for a malformed item, a model named twice, a weight not a finite number > 0."""

    def weight(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not (math.isfinite(number) and number > 0):
            raise ValueError(f"{value!r}, not a number > 0")
        return number

    return _parse_map(text, "model weight", "<weight>", "weight of model {!r} is", weight)


def format_model_bytes(sizes: dict[str, int]) -> str:
    """:data:`PARAM_FOREIGN_BYTES` text: ``"a=1048576,b=0"``, by model name."""
    return BUNDLES_SEPARATOR.join(f"{model}={int(n)}" for model, n in sorted(sizes.items()))


def parse_model_bytes(text: str) -> dict[str, int]:
    """Inverse of :func:`format_model_bytes` (also accepts spaces); ValueError for a malformed
    item, a model named twice, bytes not a decimal integer >= 0."""

    def nbytes(value: str) -> int:
        if not value.isdigit():
            raise ValueError(f"{value!r}, not an integer >= 0")
        return int(value)

    return _parse_map(text, "model bytes item", "<bytes>", "bytes of model {!r} are", nbytes)


def _parse_map(
    text: str, item: str, form: str, subject: str, parse: Callable[[str], V]
) -> dict[str, V]:
    """``"<model>=<value>,..."`` as a dict; ``parse``'s ValueError text follows ``subject``."""
    out: dict[str, V] = {}
    for entry in (i.strip() for i in text.split(BUNDLES_SEPARATOR)):
        if not entry:
            continue
        model, sep, value = (part.strip() for part in entry.partition("="))
        if not sep or not model:
            raise ValueError(f"{item} {entry!r} is not '<model>={form}'")
        try:
            parsed = parse(value)
        except ValueError as exc:
            raise ValueError(f"{subject.format(model)} {exc}") from None
        if model in out:
            raise ValueError(f"{subject.format(model)} given twice")
        out[model] = parsed
    return out
