"""deploy/ against Kubernetes' own schemas (kubernetes-validate, the `test` extra),
deploy/kserve/ against KServe's CRD schemas (scripts/check_kserve.py), the KServe
runtime against the server it runs, and scripts/check_deploy itself (with checkov
where it is installed: it lives in its own venv, see scripts/check_deploy)."""

import copy
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from scheduler import cli

kv = pytest.importorskip("kubernetes_validate")

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
sys.path.insert(0, str(ROOT / "scripts"))
import check_kserve  # noqa: E402

VERSIONS = ("1.29.0", "1.33.0")  # the oldest and newest scripts/check_deploy checks


def docs(path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def kserve(kind):
    (doc,) = [d for f in sorted((DEPLOY / "kserve").glob("*.yaml")) for d in docs(f)
              if d["kind"] == kind]
    return doc


def http_routes():
    source = (ROOT / "frontend" / "http_server.py").read_text()
    return set(re.findall(r'Route\("(/v2/[a-z/]+)"', source))


def test_every_manifest_passes_kubernetes_schemas_strictly():
    """Every Kubernetes object in deploy/ and the pod the ServingRuntime makes pass
    kubernetes-validate --strict; an unknown field fails it."""
    objects = [d for f in sorted(DEPLOY.glob("*.yaml")) if f.name != "kustomization.yaml"
               for d in docs(f)]
    objects.append(check_kserve.runtime_pod(kserve("ServingRuntime")))
    assert {o["kind"] for o in objects} >= {"Deployment", "Service", "Pod",
                                            "PersistentVolumeClaim", "NetworkPolicy"}
    for version in VERSIONS:
        for obj in objects:
            kv.validate(obj, version, strict=True)
    broken = copy.deepcopy(objects[0])
    broken["spec"]["notAField"] = 1
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, VERSIONS[-1], strict=True)


def test_kserve_objects_pass_the_crd_schemas_and_mistakes_fail():
    """The ServingRuntime and InferenceService pass KServe's CRD schemas; a misspelt
    field, a wrong type and a wrong apiVersion are each reported."""
    runtime, isvc = kserve("ServingRuntime"), kserve("InferenceService")
    assert check_kserve.errors(runtime) == []
    assert check_kserve.errors(isvc) == []
    typo = copy.deepcopy(runtime)
    typo["spec"]["supportedModelFormat"] = typo["spec"].pop("supportedModelFormats")
    assert any("supportedModelFormat" in e for e in check_kserve.errors(typo))
    wrong_type = copy.deepcopy(isvc)
    wrong_type["spec"]["predictor"]["minReplicas"] = "one"
    assert any("minReplicas" in e for e in check_kserve.errors(wrong_type))
    old = copy.deepcopy(runtime)
    old["apiVersion"] = "serving.kserve.io/v1beta1"
    assert any("apiVersion" in e for e in check_kserve.errors(old))


def test_kserve_runtime_serves_the_formats_on_kserves_ports():
    """As KServe's Triton runtime: onnx and triton picked automatically, pytorch by
    name, the v2 protocol over HTTP and gRPC; the args parse with the server's CLI, on
    KServe's ports (HTTP 8080, gRPC 9000) and its model path /mnt/models; probes hit the
    health routes on the HTTP port; /dev/shm is a sized memory emptyDir; it runs as the
    image's user; the example InferenceService picks it."""
    runtime, isvc = kserve("ServingRuntime"), kserve("InferenceService")
    spec = runtime["spec"]
    formats = {f["name"]: f.get("autoSelect", False) for f in spec["supportedModelFormats"]}
    assert formats == {"onnx": True, "triton": True, "pytorch": False}
    assert set(spec["protocolVersions"]) == {"v2", "grpc-v2"}
    (c,) = spec["containers"]
    assert c["name"] == "kserve-container"  # the name KServe merges the predictor into
    args = cli.build_parser().parse_args(c["args"])
    assert args.model_repository == ["/mnt/models"]
    assert (args.http_port, args.grpc_port) == (8080, 9000)
    assert int(spec["annotations"]["prometheus.kserve.io/port"]) == args.metrics_port
    routes = http_routes()
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready" in routes
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live" in routes
    for probe in (c["readinessProbe"], c["livenessProbe"]):
        assert probe["httpGet"]["port"] == args.http_port
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    shm = volumes[mounts["/dev/shm"]]["emptyDir"]
    assert shm["medium"] == "Memory" and shm["sizeLimit"].endswith("Gi")
    uid = re.search(r"useradd .*--uid (\d+)", (ROOT / "Dockerfile").read_text()).group(1)
    assert c["securityContext"]["runAsUser"] == int(uid)
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"/tmp", "/dev/shm"} <= set(mounts)
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in formats
    # the Deployment's Service must not select KServe's pods (other ports)
    svc = docs(DEPLOY / "service.yaml")[0]
    labels = isvc["metadata"].get("labels", {})
    assert not svc["spec"]["selector"].items() <= labels.items()


def test_check_deploy_script_passes():
    """scripts/check_deploy (KServe schemas, then kubernetes-validate) passes on the
    repository's manifests; with checkov installed (CHECKOV=path or on PATH; ~20 s
    more), checkov too. One Kubernetes version here: the test above covers both ends
    in-process, and .ci/run runs the script on all five."""
    env = dict(os.environ, PYTHON=sys.executable, K8S_VERSIONS="1.33.0")
    cmd = [str(ROOT / "scripts" / "check_deploy")]
    checkov = os.environ.get("CHECKOV") or shutil.which("checkov")
    if checkov:
        env["CHECKOV"] = checkov
    else:
        cmd.append("--no-checkov")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok   1.33.0: 6 manifests and 1 runtime pod(s)" in done.stdout
    if checkov:
        assert "Failed checks: 0" in done.stdout
