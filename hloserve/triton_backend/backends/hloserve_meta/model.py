"""Triton backend ``hloserve_meta``: a ``pb_utils`` shim over ``MetaModel`` and
``ChannelCalls`` (docs/meta_models.md): sub-calls to bundles over the channel, to foreign
models by BLS with the time left as ``timeout``; counters per docs/observability.md."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

import hloserve.jax_on_cpu  # noqa: F401  (first: JAX_PLATFORMS=cpu before any JAX import)
from hloserve.meta.channel_calls import ChannelCalls
from hloserve.meta.core import MetaModel
from hloserve.model_parameters import ModelArgs
from hloserve.triton_backend.backends import dlpack, pb

#: description per counter family, in the order ``initialize`` unpacks them
_FAMILIES = {
    "hloserve_meta_runs_total": "Meta model runs",
    "hloserve_meta_calls_total": "Sub-calls sent by meta model runs",
    "hloserve_meta_subcalls_total": "Meta sub-calls to this bundle (over the channel)",
}


def _bls(model: str, inputs: Mapping[str, Any], outputs: Sequence[str], timeout_us: int) -> Any:
    """A sub-call to a foreign model: BLS, ``timeout_us`` as the request's ``timeout``."""
    request = pb_utils.InferenceRequest(
        model_name=model,
        requested_output_names=list(outputs),
        inputs=[dlpack.to_triton_tensor(pb_utils, n, np.asarray(a)) for n, a in inputs.items()],
        timeout=timeout_us,
    )
    response = request.exec()
    if response.has_error():
        raise pb.error_from_triton(pb_utils, response.error())
    # the response owns the memory: copy what outlives it
    return {t.name(): dlpack.to_numpy(t).copy() for t in response.output_tensors()}


class TritonPythonModel:
    """One meta instance: runs one request at a time (Triton sends one per execute)."""

    def initialize(self, args: dict[str, str]) -> None:
        pb.configure_logging()
        model_args = ModelArgs.from_triton(args)
        self._calls_sent = 0

        def send(*call: Any) -> Any:
            self._calls_sent += 1
            return self.channel.send(*call)

        self.core = MetaModel.from_args(model_args, send)
        self.channel = ChannelCalls(model_args.model_dir.parent, self.core.calls, foreign=_bls)
        family = pb_utils.MetricFamily
        self._families = [
            family(name=n, description=d, kind=family.COUNTER) for n, d in _FAMILIES.items()
        ]
        labels = {"model": model_args.name}
        self._runs, self._calls = (f.Metric(labels=labels) for f in self._families[:2])
        self._subcalls = {
            m: self._families[2].Metric(labels={"model": m})
            for m in self.core.calls
            if self.channel.serves(m)
        }

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                outputs = self.core.execute(
                    dlpack.request_inputs(request), timeout_us=int(request.timeout())
                )
                wanted = request.requested_output_names()
                if wanted:
                    outputs = {n: outputs[n] for n in wanted if n in outputs}
            except Exception as exc:
                responses.append(pb.inference_response(pb_utils, exc))
                continue
            responses.append(pb.inference_response(pb_utils, outputs))
        self._runs.increment(float(len(requests)))
        if self._calls_sent:
            self._calls.increment(float(self._calls_sent))
            self._calls_sent = 0
        for callee, count in self.channel.take_sent().items():
            self._subcalls[callee].increment(float(count))
        return responses

    def finalize(self) -> None:
        self.channel.close()
        del self._runs, self._calls, self._subcalls
        self._families.clear()
