"""Validates deploy/kserve/ against KServe's CRD schemas, and writes the pod each
ServingRuntime makes for Kubernetes' own validators.

kubernetes-validate knows only Kubernetes' built-in kinds, and checkov checks only
those. So: each KServe object is validated against the openAPIV3Schema of KServe's CRD
(tests/data/kserve/*.json, written by tests/data/kserve/extract.py), strictly (an
unknown field is an error, as `kubectl apply` with server-side field validation makes
it); and each ServingRuntime's containers and volumes are written out as a Pod (with
the runtime's checkov skip annotations) for kubernetes-validate and checkov to check
like any other pod. Used by scripts/check_deploy; exits 1 on a finding.

    python scripts/check_kserve.py [--pod-dir DIR] [FILES...]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = ROOT / "tests" / "data" / "kserve"
KINDS = {"ServingRuntime": "servingruntime", "ClusterServingRuntime": "servingruntime",
         "InferenceService": "inferenceservice"}


def strict(schema: dict) -> dict:
    """`schema` with additionalProperties: false on every object that lists its
    properties and does not keep unknown fields (x-kubernetes-preserve-unknown-fields),
    as the API server's strict field validation treats them."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schema)
    # metadata is `type: object` in CRDs: the API server checks it, not the schema
    return schema


def schema_for(kind: str) -> tuple[dict, str]:
    data = json.loads((SCHEMAS / f"{KINDS[kind]}.json").read_text())
    return strict(data["schema"]), data["apiVersion"]


def errors(doc: dict) -> list[str]:
    kind = doc.get("kind")
    if kind not in KINDS:
        return [f"{kind}: not a KServe kind this check knows ({', '.join(KINDS)})"]
    schema, api_version = schema_for(kind)
    found = []
    if doc.get("apiVersion") != api_version:
        found.append(f"apiVersion {doc.get('apiVersion')!r}, the CRD serves "
                     f"{api_version!r}")
    validator = jsonschema.Draft7Validator(schema)
    for err in sorted(validator.iter_errors(doc), key=lambda e: list(e.path)):
        where = ".".join(map(str, err.path)) or "(top)"
        found.append(f"{where}: {err.message}")
    return found


def runtime_pod(doc: dict) -> dict:
    """The pod a ServingRuntime's containers and volumes make, for the built-in
    validators; the runtime's checkov skip annotations carry over."""
    spec = doc["spec"]
    annotations = {k: v for k, v in doc["metadata"].get("annotations", {}).items()
                   if k.startswith("checkov.io/")}
    pod_spec = {"containers": spec["containers"]}
    for key in ("volumes", "nodeSelector", "tolerations", "affinity", "hostIPC",
                "imagePullSecrets", "schedulerName"):
        if key in spec:
            pod_spec[key] = spec[key]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"kserve-runtime-{doc['metadata']['name']}",
                         "labels": doc["metadata"].get("labels", {}),
                         "annotations": annotations},
            "spec": pod_spec}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="*", type=Path)
    p.add_argument("--pod-dir", type=Path, help="write each runtime's pod here")
    args = p.parse_args(argv)
    files = args.files or sorted((ROOT / "deploy" / "kserve").glob("*.yaml"))
    failed = False
    for path in files:
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            name = f"{path.name}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
            found = errors(doc)
            for line in found:
                print(f"FAIL {name}: {line}")
            if not found:
                print(f"ok   {name} against KServe's {doc['kind']} CRD schema")
            failed |= bool(found)
            if args.pod_dir and doc.get("kind") in ("ServingRuntime",
                                                    "ClusterServingRuntime"):
                args.pod_dir.mkdir(parents=True, exist_ok=True)
                out = args.pod_dir / f"kserve-runtime-{doc['metadata']['name']}.yaml"
                out.write_text(yaml.safe_dump(runtime_pod(doc), sort_keys=False))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
