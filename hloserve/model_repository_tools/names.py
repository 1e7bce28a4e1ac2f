"""Names shared by the repository generator and the Triton backends.

The generated model repository (docs/serving.md, "The generated model repository") and the
backends that serve it agree on these strings; both import them from here and nowhere else
spells them out.
"""

from __future__ import annotations

#: Version of the generated repository layout; written to every front model's
#: ``hloserve.repository_format`` parameter (as text). History: 1 = front/runtime split (2025).
REPOSITORY_FORMAT = 1
#: Oldest and newest repository format the backends accept.
MIN_REPOSITORY_FORMAT = 1
MAX_REPOSITORY_FORMAT = 1

#: Triton ``backend:`` of every front model (one per bundle).
FRONT_BACKEND = "hloserve_front"
#: Triton ``backend:`` of the runtime model.
RUNTIME_BACKEND = "hloserve_runtime"
#: Model name of the single runtime model in a repository.
RUNTIME_MODEL = "hloserve_runtime"

#: Model version directory the generator writes (Triton version "1").
MODEL_VERSION = "1"
#: Where a front model's bundle copy lives, relative to the model directory.
BUNDLE_SUBDIR = "1/bundle"

#: Front parameter: the bundle directory, relative to the model directory.
PARAM_BUNDLE = "hloserve.bundle"
#: Front parameter: the name of the runtime model the front calls over BLS.
PARAM_RUNTIME_MODEL = "hloserve.runtime_model"
#: Front parameter: :data:`REPOSITORY_FORMAT` as text.
PARAM_REPOSITORY_FORMAT = "hloserve.repository_format"
#: Runtime parameter: comma-separated bundle names, each at ``<repo>/<name>/1/bundle``.
PARAM_BUNDLES = "hloserve.bundles"
#: Separator of the runtime's bundle list.
BUNDLES_SEPARATOR = ","

#: Separator between bundle and tensor in the runtime's namespaced tensor names.
NAMESPACE_SEPARATOR = "__"


def runtime_tensor_name(bundle: str, tensor: str) -> str:
    """The runtime model's name for ``tensor`` of ``bundle``: ``"<bundle>__<tensor>"``."""
    return f"{bundle}{NAMESPACE_SEPARATOR}{tensor}"


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
