"""Write the ensemble example into ``BUNDLES_DIR``: the bundles ``digits`` (the CNN of
examples/digits) and ``softmax`` (logits -> probabilities), and the Triton ensemble folder
``digits_probs`` that chains them (docs/serving.md, "Ensembles").

    python examples/digits_ensemble/export.py --out bundles
    hloserve serve bundles          # then infer "digits_probs": image -> probs

The ensemble is Triton's own (``platform: "ensemble"``): tritonserver runs its steps, each
step a bundle model served by hloserve.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "digits"))

from export import BATCH_SIZES, copy_folder, export_digits, export_main

from hloserve.export import OutputSpec, TensorSpec, export_bundle

HERE = Path(__file__).resolve().parent
#: The ensemble's folder (config.pbtxt and an empty version directory 1/).
ENSEMBLE_SOURCE = HERE / "digits_probs"


def softmax(_params: dict[str, object], logits: object) -> object:
    """probs f32 (n, 10) = softmax of logits f32 (n, 10) over the classes."""
    import jax

    return jax.nn.softmax(logits, axis=-1)


def export_softmax(bundles_dir: Path, *, overwrite: bool = True) -> Path:
    """Write ``bundles_dir/softmax`` (no weights; the digits batch sizes); returns its path."""
    out = bundles_dir / "softmax"
    logits = TensorSpec(name="logits", dtype="f32", shape="nk", dims={"k": 10})
    export_bundle(
        softmax, {}, [logits], [OutputSpec("probs", "nk")], BATCH_SIZES, out, overwrite=overwrite
    )
    print(f"softmax: bundle written to {out}")
    return out


def write_ensemble(bundles_dir: Path) -> Path:
    """Copy the ensemble folder to ``bundles_dir/digits_probs`` (replacing it)."""
    out = copy_folder(ENSEMBLE_SOURCE, bundles_dir)
    print(f"{out.name}: ensemble written to {out}")
    return out


def main() -> int:
    return export_main(__doc__, export_digits, export_softmax, write_ensemble)


if __name__ == "__main__":
    sys.exit(main())
