"""Docker HEALTHCHECK of the worker images: healthy only when the models are READY.

Triton's ``/v2/health/ready`` answers 200 as soon as the server runs (hloserve serves with
``--strict-readiness=false``), so this asks the repository index instead (Triton's model
repository extension, ``POST /v2/repository/index``): exit 0 when it lists a READY model and
every model with a state is READY, apart from those explicitly unloaded (state UNAVAILABLE,
reason "unloaded"); exit 1 otherwise, naming what is not ready.

The worker's HTTP port: ``HLOSERVE_HTTP_PORT`` if set, else the ``--http-port=N`` on the
container's command line (PID 1's, which ``hloserve node up`` and containers/compose.yaml
write), else 8000 (Triton's). In explicit model control (``hloserve serve``'s default) the
repository API is restricted: the index request carries ``HLOSERVE_MODEL_CONTROL_KEY`` in the
header ``hloserve-model-control`` (hloserve/node/model_control.py), as ``node up`` and compose
give it to the container. Without that variable the key is ``hloserve serve``'s own random one
and the index answers 403: then every model of the command line's ``--load-model`` list (or,
for none or ``*``, every model directory of the repository) must answer 200 on
``/v2/models/<name>/ready``.
"""

import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path


def command_line() -> list[str]:
    """PID 1's argv: docker-init's (``--init``) or the command's own."""
    try:
        with open("/proc/1/cmdline", "rb") as f:
            return f.read().decode(errors="replace").split("\0")
    except OSError:
        return []


def flag(argv: list[str], name: str) -> list[str]:
    return [a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")]


def fetch(url: str, body: bytes | None, key: str | None) -> bytes:
    headers = {"hloserve-model-control": key} if key else {}
    request = urllib.request.Request(url, data=body, headers=headers)
    with urllib.request.urlopen(request, timeout=4) as answer:
        return bytes(answer.read())


def from_index(models: list[dict[str, str]]) -> list[str]:
    return [
        f"{m['name']}: {m.get('state')} {m.get('reason', '')}".strip()
        for m in models
        if m.get("state") not in (None, "READY")
        and not (m.get("state") == "UNAVAILABLE" and m.get("reason") == "unloaded")
    ]


def expected_models(argv: list[str]) -> list[str]:
    """Without the key: the load list, else the repository's model directories."""
    loads = [m for m in flag(argv, "load-model") if m != "*"]
    if loads:
        return loads
    after = argv[argv.index("serve") + 1 :] if "serve" in argv else []
    repository = Path(next((a for a in after if not a.startswith("-")), "/models"))
    return sorted(p.parent.name for p in repository.glob("*/config.pbtxt"))


def main() -> int:
    argv = command_line()
    port = os.environ.get("HLOSERVE_HTTP_PORT") or (flag(argv, "http-port") or ["8000"])[-1]
    base = f"http://127.0.0.1:{port}/v2"
    key = os.environ.get("HLOSERVE_MODEL_CONTROL_KEY")
    try:
        models = json.loads(fetch(f"{base}/repository/index", b"{}", key))
        pending = from_index(models)
        ready = sum(m.get("state") == "READY" for m in models)
    except urllib.error.HTTPError as exc:
        if exc.code != 403 or key:
            print(f"repository index on port {port}: {exc}")
            return 1
        names = expected_models(argv)
        pending = []
        for name in names:
            try:
                fetch(f"{base}/models/{name}/ready", None, None)
            except OSError:
                pending.append(f"{name}: not ready")
        ready = len(names) - len(pending)
    except OSError as exc:
        print(f"tritonserver on port {port} does not answer: {exc}")
        return 1
    if pending or not ready:
        print("not ready: " + ("; ".join(pending) or "no model is loaded"))
        return 1
    print(f"{ready} models READY")
    return 0


if __name__ == "__main__":
    sys.exit(main())
