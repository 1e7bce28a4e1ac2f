"""examples/sequence: Triton's ``simple_sequence`` as a stateful bundle, and its client."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from hloserve.node import tritonserver as ts
from tests.conftest import import_example, serving_options

pytestmark = [
    pytest.mark.tritonserver,
    pytest.mark.skipif(
        importlib.util.find_spec("pytriton") is None, reason="nvidia-pytriton not installed"
    ),
]


def test_the_example_client_gets_tritons_simple_sequence_answers(tmp_path: Path) -> None:
    from hloserve.model_repository_tools.build import build_repository

    import_example("sequence", "export").export_sequence(tmp_path / "bundles")
    build_repository(tmp_path / "bundles", tmp_path / "repo")
    with ts.TritonServer(serving_options(tmp_path / "repo", tmp_path / "triton.log")) as server:
        answers = import_example("sequence", "client").run(server.urls.grpc)
    # each sequence's START is its input plus 1, later steps the input (the third: a string ID)
    assert answers[0] == (1, 101, 21) and answers[1:] == [
        (v, -v, -v) for v in (11, 7, 5, 3, 2, 0, 1)
    ]
