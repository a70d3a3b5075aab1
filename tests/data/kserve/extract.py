"""Writes the KServe CRD schemas that scripts/check_kserve.py validates deploy/kserve/
against, from a KServe checkout:

    python tests/data/kserve/extract.py ~/src/kserve

The openAPIV3Schema of each CRD's served version, descriptions dropped (most of the
size). InferenceService's schema is ~2 MB; its predictor keeps only the fields that
deploy/kserve/inferenceservice.yaml may use (PREDICTOR_FIELDS; no transformer or
explainer), since the rest is the pod spec that the ServingRuntime's own checks cover.
"""

import json
import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
CRDS = {
    "servingruntime": "config/crd/full/serving.kserve.io_servingruntimes.yaml",
    "inferenceservice": "config/crd/full/serving.kserve.io_inferenceservices.yaml",
}
PREDICTOR_FIELDS = ("model", "minReplicas", "maxReplicas", "scaleMetric", "scaleTarget",
                    "containerConcurrency", "timeout", "serviceAccountName")


def strip(node):
    if isinstance(node, dict):
        return {k: strip(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip(v) for v in node]
    return node


def main(checkout: str) -> None:
    repo = Path(checkout)
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    for name, path in CRDS.items():
        crd = yaml.safe_load((repo / path).read_text())
        (version,) = [v for v in crd["spec"]["versions"] if v.get("served")]
        schema = strip(version["schema"]["openAPIV3Schema"])
        if name == "inferenceservice":
            spec = schema["properties"]["spec"]
            spec["properties"] = {"predictor": spec["properties"]["predictor"]}
            schema["properties"].pop("status", None)
            pred = spec["properties"]["predictor"]
            pred["properties"] = {k: v for k, v in pred["properties"].items()
                                  if k in PREDICTOR_FIELDS}
        out = {"source": f"kserve/kserve@{commit} {path}",
               "apiVersion": f"{crd['spec']['group']}/{version['name']}",
               "kind": crd["spec"]["names"]["kind"], "schema": schema}
        (HERE / f"{name}.json").write_text(json.dumps(out, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
