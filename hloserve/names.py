"""Names every layer shares: config.pbtxt parameters, request parameters, model names, defaults.

The generated model repository (docs/serving.md, "The generated model repository"), the
backends that serve it, the node and the gateway agree on these strings; all import them from
here and nowhere else spells them out. It imports only the standard library, so any layer (and
every Triton stub) may import it cheaply.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

V = TypeVar("V")

#: Version of the generated repository layout; written to every front model's
#: ``hloserve.repository_format`` parameter (as text). History: 1 = front/runtime split over
#: BLS, the runtime's config listing every bundle (2025); 2 = the channel: the runtime's config
#: lists no bundles, each front loads its own bundle into the runtime (2026-12).
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

#: Front parameter: the bundle directory, relative to the model directory.
PARAM_BUNDLE = "hloserve.bundle"
#: The front spec file (:mod:`hloserve.bundle.front_spec`), relative to the model directory:
#: what the front reads of its bundle's manifest, written by the repository builder.
FRONT_SPEC = "1/front_spec.json"
#: Front parameter: the name of the runtime model the front reaches over the channel.
PARAM_RUNTIME_MODEL = "hloserve.runtime_model"
#: Front parameter: the largest request the front accepts, bytes of input tensors (decimal);
#: larger requests get INVALID_ARGUMENT naming the limit (docs/serving.md).
PARAM_MAX_REQUEST_BYTES = "hloserve.max_request_bytes"
#: Front parameter (decimal): 0 = ``execute`` waits for its batch's answers and returns the
#: responses; N > 0 = ``execute`` returns None, answers go through the response senders, at
#: most N batches in flight per instance (docs/serving.md, "Front -> runtime (the channel)").
PARAM_FRONT_INFLIGHT = "hloserve.front_inflight"
#: Default of :data:`PARAM_FRONT_INFLIGHT`.
DEFAULT_FRONT_INFLIGHT = 0
#: Front parameter (optional, decimal): how long the front waits for the runtime model to
#: become ready, seconds; absent = :data:`DEFAULT_RUNTIME_WAIT_S`.
PARAM_RUNTIME_WAIT_S = "hloserve.runtime_wait_s"
#: Default of :data:`PARAM_RUNTIME_WAIT_S`, seconds.
DEFAULT_RUNTIME_WAIT_S = 120.0
#: CPU instances per front model (``instance_group.count``): one, like Triton's default. One
#: instance gets Triton's dynamic batcher's whole batch while it waits for the runtime, so the
#: per-batch cost is shared by more requests: digits under 8 clients gave 0.75x the plain model's
#: throughput with one instance against 0.45x with two (docs/serving.md, "Front instances").
DEFAULT_FRONT_INSTANCES = 1
#: Default of :data:`PARAM_MAX_REQUEST_BYTES`: 1 GiB (256 MiB requests are tested).
DEFAULT_MAX_REQUEST_BYTES = 1 << 30
#: Default bound of Triton's queue in front of a front model (``default_queue_policy``
#: ``max_queue_size``), in largest batches: this many times the model's largest compiled batch
#: size (1 for an unbatched model) requests wait; more are refused UNAVAILABLE by Triton
#: (docs/serving.md, "Queue bounds and deadlines").
DEFAULT_QUEUE_BATCHES = 16
#: The default ``max_queue_size`` is never below this many requests: twice the gateway's
#: default admission bound (``admission.max_inflight_requests_per_worker``, 64), so a queue
#: never refuses what the gateway admitted, and a burst of tens of clients on a small-batch
#: model waits instead of failing.
DEFAULT_QUEUE_MIN = 128
#: ``default_queue_policy.default_timeout_microseconds`` of every front: 1 hour, so only a
#: request's own KServe ``timeout`` (``allow_timeout_override``) expires it in Triton's queue.
QUEUE_TIMEOUT_US = 3_600_000_000
#: Front parameter: :data:`REPOSITORY_FORMAT` as text.
PARAM_REPOSITORY_FORMAT = "hloserve.repository_format"
#: Meta parameter: the worker's gate size, the most meta runs (with calls) at once across
#: every meta model of one tritonserver, as a decimal integer (docs/meta_models.md).
PARAM_META_CONCURRENCY = "hloserve.meta_concurrency"
#: Meta parameter: the meta's ``meta.calls``, comma-separated ("" for a compute-only meta); the
#: gateway routes a meta only to workers that serve all of them.
PARAM_META_CALLS = "hloserve.meta_calls"
#: Default of :data:`PARAM_META_CONCURRENCY` (ReactantServer's ``REACTANT_META_CONCURRENCY``).
DEFAULT_META_CONCURRENCY = 2
#: Runtime parameter of repository format 1 only (comma-separated bundle names); a runtime
#: config carrying it was built by an older hloserve and is refused with a hint to rebuild.
PARAM_BUNDLES = "hloserve.bundles"
#: Separator of the runtime's bundle list.
BUNDLES_SEPARATOR = ","
#: Runtime parameter: the weight cache's byte budget for all weights, pinned ones included, as
#: a decimal integer; absent or "0" = no budget (every model's weights stay on the device).
#: docs/on_demand_weights.md.
PARAM_WEIGHT_CACHE_BYTES = "hloserve.weight_cache_bytes"
#: Runtime parameter (instead of :data:`PARAM_WEIGHT_CACHE_BYTES`): the budget as this fraction
#: (0 < f <= 1, decimal text) of the device memory free when the runtime starts
#: (``bytes_limit - bytes_in_use`` of ``Device.memory_stats()``); no budget where the device
#: reports no statistics (CPU).
PARAM_WEIGHT_CACHE_FRACTION = "hloserve.weight_cache_fraction"
#: Runtime parameter: the fraction (0 < f <= 1, decimal text) of the card's memory the
#: runtime's JAX allocator may take (``XLA_CLIENT_MEM_FRACTION``, no preallocation); absent =
#: :data:`DEFAULT_DEVICE_MEMORY_FRACTION`. docs/on_demand_weights.md, "Device memory".
PARAM_DEVICE_MEMORY_FRACTION = "hloserve.device_memory_fraction"
#: Default of :data:`PARAM_DEVICE_MEMORY_FRACTION`; the reasoning with numbers is in
#: :func:`hloserve.triton_backend.runtime.device_memory.allocator_environment`.
DEFAULT_DEVICE_MEMORY_FRACTION = 0.9
#: Runtime parameter: residency of the models that do not use :data:`DEFAULT_RESIDENCY`, as
#: ``"<model>=<residency>,..."`` sorted by model (:func:`format_residency`); absent = all default.
PARAM_RESIDENCY = "hloserve.residency"
#: Runtime parameter: free every on-demand device buffer each N on-demand loads; absent/"0" = off.
PARAM_COMPACTION_INTERVAL = "hloserve.compaction_interval"
#: Runtime parameter: the executable cache directory (absolute path), or
#: :data:`EXECUTABLE_CACHE_OFF`; absent = ``HLOSERVE_EXECUTABLE_CACHE`` or the default
#: ``$XDG_CACHE_HOME/hloserve/executables`` (docs/serving.md, "Executable cache").
PARAM_EXECUTABLE_CACHE = "hloserve.executable_cache"
#: Runtime parameter: the executable cache's size bound in bytes, as a decimal integer >= 1;
#: absent = ``HLOSERVE_EXECUTABLE_CACHE_BYTES`` or the default (4 GiB).
PARAM_EXECUTABLE_CACHE_BYTES = "hloserve.executable_cache_bytes"
#: :data:`PARAM_EXECUTABLE_CACHE` value (and ``--executable-cache`` argument) disabling it.
EXECUTABLE_CACHE_OFF = "off"
#: Residency values (ReactantServer ``residency``): host tier, pinned on the device, re-read from
#: the memory-mapped file per load. The first is the default.
RESIDENCIES = ("system", "device", "unpinned")
#: Residency of a model :data:`PARAM_RESIDENCY` does not list.
DEFAULT_RESIDENCY = RESIDENCIES[0]

#: Runtime parameter: the scheduling discipline, one of :data:`SCHEDULING_DISCIPLINES`; absent
#: = the first (docs/scheduling.md).
PARAM_SCHEDULING = "hloserve.scheduling"
#: Scheduling disciplines (ReactantServer ``scheduler.discipline``); the first is the default.
SCHEDULING_DISCIPLINES = ("fair", "fifo", "edf")
#: Runtime parameter: the ``fair`` weights of the models not weighing 1.0, as
#: ``"<model>=<weight>,..."`` sorted by model (:func:`format_model_weights`); absent = all 1.0.
PARAM_MODEL_WEIGHTS = "hloserve.model_weights"

#: Runtime parameter: the device memory hints of the repository's foreign models (Triton models
#: of other backends, docs/serving.md "Foreign models"), as ``"<model>=<bytes>,..."`` sorted by
#: model (:func:`format_model_bytes`); the runtime publishes each as
#: ``hloserve_weight_bytes{model, residency="foreign"}`` so the gateway's ``lpt_packing`` places
#: them by size. They are not in the weight cache: its budget neither counts nor evicts them.
PARAM_FOREIGN_BYTES = "hloserve.foreign_memory_bytes"

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
    """Inverse of :func:`format_residency` (also accepts the default value and spaces).

    Raises:
        ValueError: an item is not ``<model>=<residency>``, names a model twice, or gives a
            residency outside :data:`RESIDENCIES` (the message says which).
    """

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
    """Inverse of :func:`format_model_weights` (also accepts spaces and weights of 1).

    Raises:
        ValueError: an item is not ``<model>=<weight>``, names a model twice, or its weight is
            not a finite number > 0 (the message says which).
    """

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
    """Inverse of :func:`format_model_bytes` (also accepts spaces).

    Raises:
        ValueError: an item is not ``<model>=<bytes>``, names a model twice, or its bytes are
            not a decimal integer >= 0 (the message says which).
    """

    def nbytes(value: str) -> int:
        if not value.isdigit():
            raise ValueError(f"{value!r}, not an integer >= 0")
        return int(value)

    return _parse_map(text, "model bytes item", "<bytes>", "bytes of model {!r} are", nbytes)


def _parse_map(
    text: str, item: str, form: str, subject: str, parse: Callable[[str], V]
) -> dict[str, V]:
    """``"<model>=<value>,..."`` as a dict; ``parse`` raises ValueError with what follows
    ``subject`` (a format of the model name) in the message."""
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


def split_runtime_tensor_name(name: str, bundles: frozenset[str] | set[str]) -> tuple[str, str]:
    """Inverse of :func:`runtime_tensor_name` given the runtime's known bundle names.

    Bundle and tensor names may themselves contain ``"__"``, so the split is resolved against
    ``bundles``. The generator refuses repositories where a runtime tensor name starts with two
    bundle names followed by ``"__"``, so in a generated repository exactly one bundle matches
    (should several, the longest wins).

    Raises:
        KeyError: no known bundle prefixes ``name``.
    """
    best: str | None = None
    for bundle in bundles:
        prefix = bundle + NAMESPACE_SEPARATOR
        longer = best is None or len(bundle) > len(best)
        if name.startswith(prefix) and len(name) > len(prefix) and longer:
            best = bundle
    if best is None:
        raise KeyError(name)
    return best, name[len(best) + len(NAMESPACE_SEPARATOR) :]
