"""deploy/ and the Dockerfile against the server's own ports, paths and metric names:
the CLI defaults (scheduler/cli.py), the HTTP routes (frontend/http_server.py), the
metrics path and the metric families scheduler/metrics.py emits. Docker and a cluster
are not available here, so the manifests are parsed and cross-checked, not applied."""

import json
import re
from pathlib import Path

import pytest
import yaml

from scheduler import cli, metrics

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DEFAULTS = cli.build_parser().parse_args(["--model-repository", "/models"])
PORTS = {"http": DEFAULTS.http_port, "grpc": DEFAULTS.grpc_port,
         "metrics": DEFAULTS.metrics_port}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def load(name):
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d is not None]


def one(name, kind):
    docs = [d for d in load(name) if d.get("kind") == kind]
    assert len(docs) == 1, f"{name}: expected one {kind}"
    return docs[0]


def container():
    dep = one("deployment.yaml", "Deployment")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    return dep, c


def http_routes():
    source = (ROOT / "frontend" / "http_server.py").read_text()
    return set(re.findall(r'Route\("(/v2/[a-z/]+)"', source))


def emitted(name):
    """Whether scheduler/metrics.py emits series `name` (histograms as _bucket/_sum/
    _count)."""
    if name in metrics._FAMILIES:
        return metrics._FAMILIES[name][0] != "histogram"
    for suffix in HISTOGRAM_SUFFIXES:
        base = name.removesuffix(suffix)
        if name.endswith(suffix) and metrics._FAMILIES.get(base, ("",))[0] == "histogram":
            return True
    return False


def metric_names(text):
    return set(re.findall(r"\bnv_[a-z0-9_]+", text))


def test_every_manifest_parses_and_names_its_kind():
    """Every YAML file in deploy/ parses; Kubernetes objects have apiVersion, kind and
    a name, and the kustomization lists files that exist."""
    files = sorted(DEPLOY.glob("*.y*ml"))
    assert files
    for f in files:
        docs = load(f.name)
        assert docs, f.name
        for d in docs:
            if "kind" in d:
                assert d.get("apiVersion") and (d.get("metadata", {}).get("name")
                                                 or d["kind"] == "Kustomization"), f.name
    kust = one("kustomization.yaml", "Kustomization")
    for res in kust["resources"]:
        assert (DEPLOY / res).is_file(), res
    json.loads((DEPLOY / "grafana-dashboard.json").read_text())


def test_container_ports_are_the_cli_defaults_and_the_args_parse():
    """The Deployment's three named ports are the server's --http/--grpc/--metrics-port
    defaults, its args parse with the server's own CLI, and they serve /models."""
    _, c = container()
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == PORTS
    args = cli.build_parser().parse_args(c["args"])
    assert args.model_repository == ["/models"]
    assert (args.http_port, args.grpc_port, args.metrics_port) == tuple(PORTS.values())
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert "/models" in mounts


def test_probes_hit_the_health_routes():
    """Liveness on /v2/health/live, readiness on /v2/health/ready (both routes the HTTP
    frontend serves) on the http port; a startup probe leaves slow loads minutes."""
    _, c = container()
    routes = http_routes()
    live, ready, start = c["livenessProbe"], c["readinessProbe"], c["startupProbe"]
    assert live["httpGet"]["path"] == "/v2/health/live" in routes
    assert ready["httpGet"]["path"] == "/v2/health/ready" in routes
    assert start["httpGet"]["path"] in routes
    for probe in (live, ready, start):
        assert probe["httpGet"]["port"] in ("http", PORTS["http"])
    assert start["periodSeconds"] * start["failureThreshold"] >= 300


def test_dev_shm_is_a_sized_memory_emptydir():
    """/dev/shm is an emptyDir in memory with a sizeLimit above several default
    arenas (each process maps --arena-mib)."""
    dep, c = container()
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    shm = volumes[mounts["/dev/shm"]]["emptyDir"]
    assert shm["medium"] == "Memory"
    size = shm["sizeLimit"]
    units = {"Mi": 1 << 20, "Gi": 1 << 30}
    size_bytes = int(size[:-2]) * units[size[-2:]]
    assert size_bytes >= 8 * (DEFAULTS.arena_mib << 20)


def test_service_exposes_the_three_ports():
    """The Service maps the same three ports onto the container's named ports and
    selects the Deployment's pods."""
    dep, _ = container()
    svc = one("service.yaml", "Service")
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == PORTS
    assert {p["targetPort"] for p in svc["spec"]["ports"]} == set(PORTS)
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()


def test_hpa_scales_the_deployment_on_an_exported_queue_metric():
    """The HPA targets the Deployment with a per-pod metric that the server exports
    (a gauge) and that the adapter rule serves under that name."""
    dep, _ = container()
    hpa = one("hpa.yaml", "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
    assert hpa["spec"]["scaleTargetRef"]["kind"] == "Deployment"
    (m,) = hpa["spec"]["metrics"]
    name = m["pods"]["metric"]["name"]
    assert name == "nv_inference_pending_request_count"
    assert metrics._FAMILIES[name][0] == "gauge"
    rules = yaml.safe_load(one("prometheus-adapter.yaml", "ConfigMap")["data"]
                           ["config.yaml"])["rules"]
    served = [r for r in rules if r["name"]["as"] == name]
    assert len(served) == 1
    assert metric_names(served[0]["seriesQuery"]) == {name}
    assert set(served[0]["resources"]["overrides"]) == {"namespace", "pod"}


def test_scrape_config_reads_the_metrics_port_and_path():
    """Prometheus scrapes the pods' metrics port and the path the metrics server
    answers (/metrics), keeping the namespace and pod labels the adapter maps."""
    dep, _ = container()
    source = Path(metrics.__file__).read_text()
    assert '== "/metrics"' in source
    ann = dep["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/path"] == "/metrics"
    assert int(ann["prometheus.io/port"]) == PORTS["metrics"]
    (job,) = yaml.safe_load((DEPLOY / "prometheus-scrape.yml").read_text())[
        "scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    targets = {r.get("target_label") for r in job["relabel_configs"]}
    assert {"namespace", "pod", "__address__"} <= targets


def test_dashboard_plots_only_metrics_the_server_exports():
    """Every Grafana query names only series scheduler/metrics.py emits, and the
    dashboard covers throughput, failures, the queue and latency histograms."""
    dash = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = set().union(*(metric_names(e) for e in exprs))
    unknown = {n for n in used if not emitted(n)}
    assert not unknown, unknown
    assert {"nv_inference_request_success", "nv_inference_request_failure",
            "nv_inference_pending_request_count",
            "nv_inference_request_histogram_ms_bucket"} <= used
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


def test_dockerfile_serves_models_on_the_default_ports():
    """The Dockerfile exposes the three default ports, starts `shmserve` (the console
    script pyproject declares) on /models, and its EXTRAS are extras pyproject has."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    text = (ROOT / "Dockerfile").read_text()
    exposed = re.search(r"^EXPOSE (.+)$", text, re.M).group(1).split()
    assert sorted(map(int, exposed)) == sorted(PORTS.values())
    entry = json.loads(re.search(r"^ENTRYPOINT (.+)$", text, re.M).group(1))
    cmd = json.loads(re.search(r"^CMD (.+)$", text, re.M).group(1))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert entry == ["shmserve"] and "shmserve" in project["scripts"]
    args = cli.build_parser().parse_args(cmd)
    assert args.model_repository == ["/models"]
    assert (args.http_port, args.grpc_port, args.metrics_port) == tuple(PORTS.values())
    assert 'VOLUME ["/models"]' in text
    assert "/v2/health/ready" in text
    default_extra = re.search(r"^ARG EXTRAS=(\S+)$", text, re.M).group(1)
    assert default_extra == "cpu" and "gpu" in project["optional-dependencies"]
    # the COPY lines bring every package the wheel is built from
    for pkg in ("frontend", "scheduler", "shm", "workers"):
        assert re.search(rf"^COPY {pkg} ", text, re.M), pkg


def test_pod_runs_as_the_image_user():
    """The pod's runAsUser is the uid the Dockerfile creates its user with, so the
    non-root pod can write its home (the EXECUTION_ENV_PATH cache) and /tmp."""
    dep, _ = container()
    uid = re.search(r"useradd .*--uid (\d+)", (ROOT / "Dockerfile").read_text()).group(1)
    ctx = dep["spec"]["template"]["spec"]["securityContext"]
    assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] == int(uid)


# The metric families Triton 2.51 exports by default (read from its /metrics, CPU build,
# python backend; plus the GPU and cache families it adds with a GPU or a response
# cache). Its first-response histogram needs --metrics-config histogram_latencies=true.
TRITON_FAMILIES = {
    "nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
    "nv_inference_exec_count", "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us", "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us", "nv_inference_compute_output_duration_us",
    "nv_inference_pending_request_count", "nv_pinned_memory_pool_total_bytes",
    "nv_pinned_memory_pool_used_bytes", "nv_cpu_utilization", "nv_cpu_memory_total_bytes",
    "nv_cpu_memory_used_bytes", "nv_gpu_utilization", "nv_gpu_memory_total_bytes",
    "nv_gpu_memory_used_bytes", "nv_gpu_power_usage", "nv_gpu_power_limit",
    "nv_energy_consumption", "nv_cache_num_hits_per_model", "nv_cache_num_misses_per_model",
    "nv_cache_hit_duration_per_model", "nv_cache_miss_duration_per_model",
}


def test_dashboard_panels_fall_back_or_say_so_for_triton_pods():
    """Five panels plot series a default Triton does not export. Each query of theirs
    either falls back, for models with no such series, to Triton's families
    (`or on (model)`, labelled by `stat`), or its panel's title says what it needs;
    the other panels use Triton's families only."""
    dash = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    affected = 0
    for panel in dash["panels"]:
        if all(metric_names(t["expr"].partition(" or on (model) ")[0]) <= TRITON_FAMILIES
               for t in panel["targets"]):
            continue
        affected += 1
        for target in panel["targets"]:
            expr = target["expr"]
            primary, _, fallback = expr.partition(" or on (model) ")
            if metric_names(primary) <= TRITON_FAMILIES:
                continue
            if fallback:
                assert metric_names(fallback) <= TRITON_FAMILIES, expr
                assert "stat" in target["legendFormat"], panel["title"]
            else:
                assert re.search(r"shmserve only|histogram_latencies|mean where no "
                                 r"histogram", panel["title"]), panel["title"]
    assert affected == 5


def test_model_claim_binds_on_the_default_storage_class():
    """ReadWriteOnce on the default class binds on every cluster with a provisioner;
    ReadOnlyMany with no class stayed Pending on most."""
    pvc = one("models-pvc.yaml", "PersistentVolumeClaim")
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert "storageClassName" not in pvc["spec"]
    dep, c = container()
    claims = [v["persistentVolumeClaim"]["claimName"]
              for v in dep["spec"]["template"]["spec"]["volumes"]
              if "persistentVolumeClaim" in v]
    assert claims == [pvc["metadata"]["name"]]


def test_pod_security_defaults_leave_the_server_its_writable_paths():
    """No service account token, RuntimeDefault seccomp, no capabilities, a read-only
    root filesystem; the paths the server writes (tempfile's /tmp, the
    EXECUTION_ENV_PATH cache, /dev/shm) are volumes. scripts/container_check runs the
    image the same way (--read-only, --cap-drop=ALL)."""
    dep, c = container()
    pod = dep["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    ctx = c["securityContext"]
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["capabilities"]["drop"] == ["ALL"]
    assert ctx["allowPrivilegeEscalation"] is False
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert {"/tmp", "/home/shmserve/.cache", "/dev/shm"} <= mounts
    # with no CPU limit the default frontend count would follow the node's cores
    assert "cpu" not in c["resources"].get("limits", {})
    args = cli.build_parser().parse_args(c["args"])
    assert args.frontend_processes == 1
