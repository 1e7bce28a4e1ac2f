"""Export the cascade's three bundles into ``BUNDLES_DIR``: ``digits`` (the CNN of
examples/digits), ``digits_fast`` (logistic regression) and ``digits_cascade`` (the meta).

    python examples/digits_cascade/export.py --out bundles

Both models train on the digits training split (fixed seeds); prints their held-out accuracy.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "digits"))

import digits_model
import fast_model
from export import BATCH_SIZES, IMAGE, LOGITS, export_digits

from hloserve.bundle import check_bundle
from hloserve.export import export_bundle

HERE = Path(__file__).resolve().parent
#: The meta bundle's source (manifest.yaml + model.py), copied as BUNDLES_DIR/digits_cascade.
META_SOURCE = HERE / "digits_cascade"


def export_fast(bundles_dir: Path, *, overwrite: bool = True) -> Path:
    """Train the fast model and write ``bundles_dir/digits_fast``; returns the bundle path."""
    train_x, train_y, test_x, test_y = digits_model.load_split()
    params = fast_model.train(train_x, train_y)
    acc = digits_model.accuracy(np.asarray(fast_model.apply(params, test_x)), test_y)
    print(f"digits_fast: JAX model accuracy on the held-out split: {acc:.4f}")
    out = bundles_dir / "digits_fast"
    export_bundle(
        fast_model.apply, params, [IMAGE], [LOGITS], BATCH_SIZES, out, overwrite=overwrite
    )
    print(f"digits_fast: bundle written to {out}")
    return out


def write_meta(bundles_dir: Path) -> Path:
    """Copy the meta bundle to ``bundles_dir/digits_cascade`` (replacing it) and check it."""
    out = bundles_dir / "digits_cascade"
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(META_SOURCE, out, ignore=shutil.ignore_patterns("__pycache__"))
    check_bundle(out, models={"digits": "model", "digits_fast": "model"})
    print(f"digits_cascade: meta bundle written to {out}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, metavar="BUNDLES_DIR")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("jax").setLevel(logging.WARNING)
    args.out.mkdir(parents=True, exist_ok=True)
    export_digits(args.out)
    export_fast(args.out)
    write_meta(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
