"""The minilm bundle's hooks (copied into the bundle as ``model.py``).

Runs in the front model's instances, never in the runtime (no JAX here): NumPy and the
``tokenizers`` library only, with the ``tokenizer.json`` that sits beside this file.

* :func:`preprocess`: client ``text`` (BYTES ``[batch]``, UTF-8) -> executable ``input_ids``
  and ``attention_mask`` (i32 ``[batch, tokens]``), padded to the longest text of the request
  and truncated at 128 tokens. The front then picks the smallest sequence bucket (32 or 128)
  that holds ``tokens`` and zero-pads to it.
* :func:`postprocess`: executable ``token_embeddings`` (f32 ``[batch, tokens, 384]``) -> client
  ``embedding`` (f32 ``[batch, 384]``): mean over the attention mask, then L2-normalized.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

#: Longest token sequence served (the largest compiled bucket); longer texts are truncated.
MAX_TOKENS = 128

_tokenizer = Tokenizer.from_file(str(Path(__file__).resolve().parent / "tokenizer.json"))
_tokenizer.no_padding()
_tokenizer.enable_truncation(max_length=MAX_TOKENS)


def _decode(item: object, index: int) -> str:
    if isinstance(item, str):
        return item
    if not isinstance(item, bytes):
        raise ValueError(f"text[{index}]: expected bytes, got {type(item).__name__}")
    try:
        return item.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"text[{index}]: not UTF-8 ({exc.reason} at byte {exc.start})") from None


def preprocess(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Tokenize ``text`` (BYTES ``[batch]``) into i32 ``input_ids`` / ``attention_mask``.

    Raises:
        ValueError: an element is not UTF-8 (the front answers INVALID_ARGUMENT).
    """
    texts = [_decode(t, i) for i, t in enumerate(inputs["text"].reshape(-1))]
    encodings = _tokenizer.encode_batch(texts)
    tokens = max(len(e.ids) for e in encodings)
    ids = np.zeros((len(texts), tokens), np.int32)
    mask = np.zeros((len(texts), tokens), np.int32)
    for row, enc in enumerate(encodings):
        ids[row, : len(enc.ids)] = enc.ids
        mask[row, : len(enc.ids)] = enc.attention_mask
    return {"input_ids": ids, "attention_mask": mask}


def postprocess(
    outputs: dict[str, np.ndarray], inputs: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Mean-pool ``token_embeddings`` over ``attention_mask`` and L2-normalize each row."""
    hidden = outputs["token_embeddings"].astype(np.float32)
    mask = inputs["attention_mask"][..., None].astype(np.float32)
    pooled = (hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
    norm = np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
    return {"embedding": (pooled / norm).astype(np.float32)}
