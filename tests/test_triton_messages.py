"""Triton's error texts that hloserve recognises (hloserve/triton_messages.py), verbatim as
tritonserver 2.51 writes them, and texts that must not be mistaken for them."""

from __future__ import annotations

from hloserve import triton_messages as tm


def test_model_not_ready_is_the_bls_text_for_a_loading_or_absent_model() -> None:
    assert tm.model_not_ready(
        "Failed for execute the inference request. Model 'hloserve_runtime' is not ready."
    )
    assert not tm.model_not_ready("Request for unknown model: 'x' is not found")


def test_server_not_ready_is_the_refusal_while_the_server_starts() -> None:
    assert tm.server_not_ready("Model digits - Error when running inference: Server not ready")
    assert not tm.server_not_ready("Model 'digits' is not ready.")


def test_unknown_model_ignores_case_and_knows_both_wordings() -> None:
    assert tm.unknown_model("Request for unknown model: 'x' is not found")
    assert tm.unknown_model("Request for Unknown Model: 'x'")
    assert tm.unknown_model("model 'x' is not found")
    assert not tm.unknown_model("Failed for execute the inference request. Model 'x' is not ready.")


def test_timeout_expired_is_the_queue_timeout() -> None:
    assert tm.timeout_expired("Request timeout expired")
    assert not tm.timeout_expired("model 'meta': deadline exceeded in the call to model 'x'")


def test_api_restricted_is_the_refusal_without_the_key() -> None:
    assert tm.api_restricted(
        "This API is restricted, expecting header 'triton-grpc-protocol-hloserve-model-control'"
    )
    assert not tm.api_restricted("Request for unknown model: 'x' is not found")
