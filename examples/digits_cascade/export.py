"""Export the cascade's three bundles into ``BUNDLES_DIR``: ``digits`` (the CNN of
examples/digits), ``digits_fast`` (logistic regression) and ``digits_cascade`` (the meta).

    python examples/digits_cascade/export.py --out bundles

Both models train on the digits training split (fixed seeds); prints their held-out accuracy.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "digits"))

import digits_model
import fast_model
from export import BATCH_SIZES, IMAGE, LOGITS, copy_folder, export_digits, export_main

from hloserve.bundle.validate import check_bundle
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
    out = copy_folder(META_SOURCE, bundles_dir)
    check_bundle(out, models={"digits": "model", "digits_fast": "model"})
    print(f"digits_cascade: meta bundle written to {out}")
    return out


def main() -> int:
    return export_main(__doc__, export_digits, export_fast, write_meta)


if __name__ == "__main__":
    sys.exit(main())
