"""Train the digits CNN (fixed seed) and export it as a bundle: ``BUNDLES_DIR/digits/``.

    python examples/digits/export.py --out bundles [--symbolic]

Input ``image`` f32 ``nhwc`` (8, 8, 1); output ``logits`` f32 ``nk`` (k=10); compiled batch
sizes 1, 8, 32 (``--symbolic``: one artifact for every batch size, the sizes chosen by
``hloserve repo build --batch-sizes``; docs/bundles.md, "Symbolic batch"). Prints the held-out
accuracy of the trained JAX model.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import digits_model

from hloserve.export import OutputSpec, TensorSpec, export_bundle

BATCH_SIZES = (1, 8, 32)
IMAGE = TensorSpec(name="image", dtype="f32", shape="nhwc", dims={"h": 8, "w": 8, "c": 1})
LOGITS = OutputSpec(name="logits", shape="nk")


def export_digits(
    bundles_dir: Path,
    *,
    overwrite: bool = True,
    symbolic: bool = False,
    untrained_seed: int | None = None,
    name: str = "digits",
) -> Path:
    """Train, check accuracy, and write ``bundles_dir/<name>``; returns the bundle path.

    With ``untrained_seed``, the weights are :func:`digits_model.init_params` of that seed
    instead (no training, no scikit-learn: for checks on machines without it, e.g. the GPU
    check, docs/gpu_check.md); the executables are the same, the answers are not digits.
    """
    if untrained_seed is None:
        params = digits_model.train()
        _, _, test_x, test_y = digits_model.load_split()
        acc = digits_model.accuracy(np.asarray(digits_model.apply(params, test_x)), test_y)
        print(f"digits: JAX model accuracy on the held-out split: {acc:.4f}")
    else:
        params = untrained_params(untrained_seed)
    out = bundles_dir / name
    sizes = "symbolic" if symbolic else BATCH_SIZES
    export_bundle(digits_model.apply, params, [IMAGE], [LOGITS], sizes, out, overwrite=overwrite)
    print(f"{name}: bundle written to {out}")
    return out


def untrained_params(seed: int) -> digits_model.Params:
    """:func:`digits_model.init_params` of ``seed`` as host NumPy arrays."""
    import jax

    return jax.tree_util.tree_map(np.asarray, digits_model.init_params(jax.random.PRNGKey(seed)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="BUNDLES_DIR",
        help="directory that receives the digits/ bundle",
    )
    parser.add_argument(
        "--symbolic",
        action="store_true",
        help="one artifact with a symbolic batch axis instead of one per batch size",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("jax").setLevel(logging.WARNING)  # its platform probing is INFO noise
    export_digits(args.out, symbolic=args.symbolic)
    return 0


def export_main(doc: str, *steps: Callable[[Path], object]) -> int:
    """The command line of the examples built on digits: ``--out BUNDLES_DIR``, then each step
    (a function of the bundles directory) in order; ``doc``'s first paragraph is the help."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, metavar="BUNDLES_DIR")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("jax").setLevel(logging.WARNING)
    args.out.mkdir(parents=True, exist_ok=True)
    for step in steps:
        step(args.out)
    return 0


def copy_folder(source: Path, bundles_dir: Path) -> Path:
    """Copy ``source`` to ``bundles_dir/<its name>`` (replacing it, no __pycache__); its path."""
    out = bundles_dir / source.name
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(source, out, ignore=shutil.ignore_patterns("__pycache__"))
    return out


if __name__ == "__main__":
    sys.exit(main())
