"""Semantic search over a small corpus with the served ``minilm`` model (tritonclient, gRPC).

    python examples/minilm/search.py --url 127.0.0.1:8001 "how do I cook pasta?"

Embeds the corpus (one request per 32 texts), embeds each query, and prints the corpus texts
ranked by cosine similarity (the embeddings are unit length, so cosine = dot product).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

CORPUS = [
    "Boil the pasta in salted water for nine minutes, then drain it.",
    "The stock market fell sharply after the interest rate announcement.",
    "A golden retriever is a friendly, intelligent dog breed.",
    "Paris is the capital and most populous city of France.",
    "Regular exercise improves heart health and mood.",
    "The new phone has a larger screen and a faster processor.",
    "Photosynthesis turns sunlight, water and carbon dioxide into sugar.",
    "The football match ended in a two-all draw after extra time.",
    "Machine translation systems convert text from one language into another.",
    "Tokyo is Japan's busiest city and its capital.",
    "Bake the bread at 220 degrees until the crust is brown.",
    "Cats sleep for around fifteen hours a day.",
]

#: Largest batch the model serves per request (its largest compiled batch size).
MAX_BATCH = 32


def embed(client: Any, texts: Sequence[str], model: str = "minilm") -> np.ndarray:
    """f32 ``[len(texts), 384]`` unit-length embeddings, ``MAX_BATCH`` texts per request."""
    import tritonclient.grpc as grpcclient

    parts = []
    for start in range(0, len(texts), MAX_BATCH):
        chunk = texts[start : start + MAX_BATCH]
        data = np.array([t.encode("utf-8") for t in chunk], dtype=object).reshape(-1, 1)
        tensor = grpcclient.InferInput("text", list(data.shape), "BYTES")
        tensor.set_data_from_numpy(data)
        parts.append(client.infer(model, [tensor]).as_numpy("embedding"))
    return np.concatenate(parts) if parts else np.zeros((0, 384), np.float32)


def search(
    client: Any, queries: Sequence[str], corpus: Sequence[str] = CORPUS, top: int = 3
) -> list[list[tuple[float, str]]]:
    """For each query, the ``top`` corpus texts as (cosine, text), best first."""
    docs = embed(client, corpus)
    scores = embed(client, queries) @ docs.T
    return [
        [(float(row[j]), corpus[j]) for j in np.argsort(-row, kind="stable")[:top]]
        for row in scores
    ]


def main() -> int:
    import tritonclient.grpc as grpcclient

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("queries", nargs="+", help="query texts")
    parser.add_argument("--url", default="127.0.0.1:8001", help="gRPC host:port")
    parser.add_argument("--top", type=int, default=3, help="results per query")
    args = parser.parse_args()
    client = grpcclient.InferenceServerClient(args.url)
    for query, hits in zip(args.queries, search(client, args.queries, top=args.top), strict=True):
        print(f"query: {query}")
        for score, text in hits:
            print(f"  {score:.3f}  {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
