"""deploy/'s Prometheus files checked by Prometheus's own promtool (where it is
installed): the scrape config, every Grafana dashboard query as PromQL, and the
dashboard's fallbacks evaluated on synthetic series. promtool runs as a child process,
so these live apart from the in-process unit suite (tests/unit/test_deploy.py checks
the same files by parsing them)."""

import json
import shutil
import subprocess

import pytest
import yaml

from tests.unit.test_deploy import DEPLOY, PORTS, metric_names


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_accepts_the_scrape_config(tmp_path):
    """Prometheus's own checker accepts the scrape config (its relabel rules and
    regexes). Debian's Prometheus is built without Kubernetes discovery; there the
    pod discovery is swapped for a static target and the rest is checked."""
    def check(path):
        return subprocess.run(["promtool", "check", "config", "--syntax-only", str(path)],
                              capture_output=True, text=True, timeout=60)

    path = DEPLOY / "prometheus-scrape.yml"
    done = check(path)
    if "field kubernetes_sd_configs not found" in done.stdout + done.stderr:
        config = yaml.safe_load(path.read_text())
        for job in config["scrape_configs"]:
            del job["kubernetes_sd_configs"]
            job["static_configs"] = [{"targets": [f"127.0.0.1:{PORTS['metrics']}"]}]
        path = tmp_path / "scrape.yml"
        path.write_text(yaml.safe_dump(config))
        done = check(path)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_parses_every_dashboard_query(tmp_path):
    """Every Grafana query is valid PromQL (checked as recording rules by promtool),
    the `or on (model)` fallbacks and label_replace calls included."""
    dash = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    rules = [{"record": f"panel_{p['id']}_{i}", "expr": t["expr"]}
             for p in dash["panels"] for i, t in enumerate(p["targets"])]
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run(["promtool", "check", "rules", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_dashboard_fallbacks_draw_triton_means(tmp_path):
    """Evaluated by promtool on synthetic series: a model with shmserve's histograms
    gets its p99 (stat="p99"), a model with only Triton's counters gets the mean per
    request (stat="mean") instead of nothing, in the panels that fall back."""
    dash = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    rules, expected = [], []
    means = {"nv_inference_request_histogram_ms": 0.1, "nv_inference_queue_histogram_ms": 0.1,
             "nv_inference_compute_histogram_ms": 0.3}  # ms, from the counters below
    for p in dash["panels"]:
        for i, t in enumerate(p["targets"]):
            if " or on (model) " not in t["expr"]:
                continue
            name = f"panel_{p['id']}_{i}"
            rules.append({"record": name, "expr": t["expr"]})
            (hist,) = metric_names(t["expr"]) & {h + "_bucket" for h in means}
            # all of model a's observations fall in the 1 ms bucket: p99 = 0.99 of it
            expected.append({"expr": name, "eval_time": "5m", "exp_samples": [
                {"labels": f'{name}{{model="a",stat="p99"}}', "value": 0.9899999999999999},
                {"labels": f'{name}{{model="b",stat="mean"}}',
                 "value": means[hist.removesuffix("_bucket")]}]})
    assert len(rules) == 3
    series = [{"series": f'{h}_bucket{{model="a",le="{le}"}}', "values": "0+10x10"}
              for h in means for le in ("1", "+Inf")]
    # model b, Triton: 100 us per second on each duration counter, one request and
    # one execution per second
    for counter in ("request", "queue", "compute_input", "compute_infer",
                    "compute_output"):
        series += [{"series": f'nv_inference_{counter}_duration_us{{model="{m}"}}',
                    "values": "0+6000x10"} for m in "ab"]
    for counter in ("nv_inference_request_success", "nv_inference_exec_count"):
        series += [{"series": f'{counter}{{model="{m}"}}', "values": "0+60x10"}
                   for m in "ab"]
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(
        {"groups": [{"name": "dashboard", "rules": rules}]}))
    (tmp_path / "test.yml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series,
                   "promql_expr_test": expected}]}))
    done = subprocess.run(["promtool", "test", "rules", "test.yml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
