"""Docker HEALTHCHECK of the worker images: healthy only when the models are READY.

Triton's ``/v2/health/ready`` answers 200 as soon as the server runs (hloserve serves with
``--strict-readiness=false``), so this asks the repository index instead (Triton's model
repository extension, ``POST /v2/repository/index``): exit 0 when it lists a READY model and
every model with a state is READY, apart from those explicitly unloaded (state UNAVAILABLE,
reason "unloaded"); exit 1 otherwise, naming what is not ready. The worker's HTTP port:
``HLOSERVE_HTTP_PORT`` if set, else the ``--http-port=N`` on the container's command line
(PID 1's, which ``hloserve node up`` and containers/compose.yaml write), else 8000 (Triton's).
In explicit model control the repository API is restricted: the request carries the key of
``HLOSERVE_MODEL_CONTROL_KEY`` in the header ``hloserve-model-control``
(hloserve/node/model_control.py), as ``node up`` gives it to the container.
"""

import json
import os
import sys
import urllib.request


def http_port() -> str:
    """The port to ask: the environment, then PID 1's command line, then Triton's default."""
    if os.environ.get("HLOSERVE_HTTP_PORT"):
        return os.environ["HLOSERVE_HTTP_PORT"]
    try:
        with open("/proc/1/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except OSError:
        argv = []
    ports = [a.split("=", 1)[1] for a in argv if a.startswith("--http-port=")]
    return ports[-1] if ports else "8000"


def main() -> int:
    port = http_port()
    key = os.environ.get("HLOSERVE_MODEL_CONTROL_KEY")
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v2/repository/index",
        data=b"{}",
        method="POST",
        headers={"hloserve-model-control": key} if key else {},
    )
    try:
        with urllib.request.urlopen(request, timeout=4) as answer:
            models = json.load(answer)
    except OSError as exc:
        print(f"tritonserver on port {port} does not answer: {exc}")
        return 1
    pending = [
        f"{m['name']}: {m.get('state')} {m.get('reason', '')}".strip()
        for m in models
        if m.get("state") not in (None, "READY")
        and not (m.get("state") == "UNAVAILABLE" and m.get("reason") == "unloaded")
    ]
    if pending or not any(m.get("state") == "READY" for m in models):
        print("not ready: " + ("; ".join(pending) or "no model is loaded"))
        return 1
    print(f"{sum(m.get('state') == 'READY' for m in models)} models READY")
    return 0


if __name__ == "__main__":
    sys.exit(main())
