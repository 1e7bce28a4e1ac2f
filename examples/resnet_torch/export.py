"""Export a ResNet-18 (PyTorch, fixed seed, no download) as ``BUNDLES_DIR/resnet_torch/``.

    python examples/resnet_torch/export.py --out bundles
    # or, the same bundle from the command line:
    hloserve export torch examples.resnet_torch.export:build \\
        --input image:f32:nchw:c=3,h=224,w=224 --output logits:nk --batch-sizes 1,8 \\
        --out bundles/resnet_torch

The module is :func:`resnet.resnet18` (torchvision's layout) with weights drawn from seed 0 and
BatchNorm running statistics set to non-trivial values, so that the check exercises every
weight and buffer. Input ``image`` f32 ``[n, 3, 224, 224]`` (NCHW, as torch takes it), output
``logits`` f32 ``[n, 1000]``; batch sizes 1 and 8 (Triton pads a batch of 3 up to 8).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import resnet

from hloserve.bundle.bundle import Bundle
from hloserve.export import OutputSpec, TensorSpec, export_torch

SEED = 0
BATCH_SIZES = (1, 8)
INPUTS = [TensorSpec(name="image", dtype="f32", shape="nchw", dims={"c": 3, "h": 224, "w": 224})]
OUTPUTS = [OutputSpec(name="logits", shape="nk")]


def build() -> Any:
    """ResNet-18 in eval mode, weights and BatchNorm statistics from seed :data:`SEED`."""
    import torch

    torch.manual_seed(SEED)
    model = resnet.resnet18()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.1, 0.1)
    return model.eval()


def export_resnet(
    bundles_dir: Path,
    *,
    batch_sizes: tuple[int, ...] = BATCH_SIZES,
    overwrite: bool = True,
    progress: Any = None,
) -> Bundle:
    """Write ``bundles_dir/resnet_torch`` and return it (validated)."""
    bundle = export_torch(
        build(),
        INPUTS,
        OUTPUTS,
        batch_sizes,
        bundles_dir / "resnet_torch",
        overwrite=overwrite,
        progress=progress,
    )
    print(f"resnet_torch: bundle written to {bundle.path}")
    return bundle


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, required=True, metavar="BUNDLES_DIR", help="receives resnet_torch/"
    )
    args = parser.parse_args()
    export_resnet(args.out, progress=lambda line: print(f"resnet_torch: {line}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
