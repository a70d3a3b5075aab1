"""Prometheus metrics end to end: the counts of a batch formed exactly (the batcher is
held with TRITONSERVER_DELAY_SCHEDULER) appear on --metrics-port under Triton's names,
read with prometheus_client's parser, and a real Prometheus server scrapes them and
answers a query with the same numbers."""

import concurrent.futures as cf
import json
import re
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.e2e.clients import PROTOCOLS, client, infer_input
from tests.e2e.conftest import HOLD
from tests.e2e.harness import ROOT, ServerProcess, free_ports, wait_until

pytestmark = pytest.mark.e2e

MODELS_SCHED = ROOT / "tests" / "models_sched"
MODEL = {"model": "delayed_batch", "version": "1"}



def scrape(server) -> str:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return r.read().decode()


def samples(server) -> dict:
    """{(sample name, frozenset(labels)): value} of one scrape, as Prometheus reads it.
    prometheus_client's parser names counter samples `<family>_total` as it reads them
    (the text itself has no suffix, see below): they are keyed by the family's name."""
    out = {}
    for fam in text_string_to_metric_families(scrape(server)):
        for s in fam.samples:
            name = fam.name if s.name == fam.name + "_total" else s.name
            out[(name, frozenset(s.labels.items()))] = s.value
    return out


def value(found: dict, name: str, **labels) -> float:
    return found[(name, frozenset({**MODEL, **labels}.items()))]


def infer(server, protocol, x):
    return client(server, protocol).infer(
        "delayed_batch", [infer_input(protocol, "INPUT0", x, "FP32")])


def test_counts_of_a_held_batch_under_tritons_names(held_server):
    # Rule: nv_inference_pending_request_count is the requests queued, not yet running:
    # with the batcher held for HOLD requests, HOLD - 1 wait.
    x = np.ones((1, 4), np.float32)
    with cf.ThreadPoolExecutor(HOLD) as pool:
        first = [pool.submit(infer, held_server, PROTOCOLS[i % 2], x) for i in range(HOLD - 1)]
        wait_until(lambda: value(samples(held_server),
                                 "nv_inference_pending_request_count") == HOLD - 1,
                   60, 0.1, "pending count")
        last = pool.submit(infer, held_server, "http", x)
        for f in first + [last]:
            f.result(timeout=60)

    # Rule: success and nv_inference_count count requests (batch items), exec_count
    # executions; the held requests formed one batch.
    # (polled: the answers can reach the clients before the scheduler counts the batch)
    def counted():
        found = samples(held_server)
        return found if value(found, "nv_inference_request_success") == HOLD else None

    found = wait_until(counted, 60, 0.1, "the held batch counted")
    assert value(found, "nv_inference_count") == HOLD
    assert value(found, "nv_inference_exec_count") == 1
    assert value(found, "nv_inference_pending_request_count") == 0
    # each request's compute holds the model's 20 ms sleep
    assert value(found, "nv_inference_compute_infer_duration_us") >= HOLD * 20_000
    assert value(found, "nv_inference_request_duration_us") >= value(
        found, "nv_inference_queue_duration_us")
    # Beyond Triton: latency histograms, one observation per successful request, and
    # the compute histogram one per execution.
    assert value(found, "nv_inference_request_histogram_ms_count") == HOLD
    assert value(found, "nv_inference_first_response_histogram_ms_count") == HOLD
    assert value(found, "nv_inference_queue_histogram_ms_count") == HOLD
    assert value(found, "nv_inference_compute_histogram_ms_count") == 1
    assert value(found, "nv_inference_compute_histogram_ms_bucket", le="+Inf") == 1
    assert value(found, "nv_model_load_duration_secs") > 0
    assert found[("nv_cpu_memory_total_bytes", frozenset())] > 0

    # Rule: a request whose execute() raises counts under reason BACKEND; its execution
    # counts. An error response the model returns counts as a success, as on Triton.
    with pytest.raises(InferenceServerException, match="execute failed"):
        infer(held_server, "grpc", np.full((1, 4), -2, np.float32))
    with pytest.raises(InferenceServerException, match="negative input"):
        infer(held_server, "grpc", -np.ones((1, 4), np.float32))
    found = samples(held_server)
    assert value(found, "nv_inference_request_failure", reason="BACKEND") == 1
    assert value(found, "nv_inference_request_failure", reason="REJECTED") == 0
    assert value(found, "nv_inference_request_success") == HOLD + 1
    assert value(found, "nv_inference_exec_count") == 3

    # Rule: the same numbers as the statistics extension (one set of counters).
    st = client(held_server, "http").get_inference_statistics("delayed_batch")
    (m,) = st["model_stats"]
    assert m["execution_count"] == value(found, "nv_inference_exec_count")
    assert m["inference_stats"]["fail"]["count"] == 1


def test_help_and_type_lines_are_tritons(held_server):
    text = scrape(held_server)
    assert ("# HELP nv_inference_request_success Number of successful inference requests, "
            "all batch sizes\n# TYPE nv_inference_request_success counter\n") in text
    assert "# TYPE nv_inference_pending_request_count gauge\n" in text
    # Triton's counters carry no `_total` suffix
    assert not re.search(r"^\w+_total[{ ]", text, re.M)
    # the port serves /metrics only
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(f"http://127.0.0.1:{held_server.metrics_port}/other",
                               timeout=10)
    assert exc.value.code == 404


def test_no_metrics_port_without_allow_metrics(tmp_path):
    with ServerProcess(MODELS_SCHED, "--allow-metrics", "false", log_dir=tmp_path) as srv:
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics",
                                   timeout=5)


@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="prometheus not installed (scripts/setup installs it where "
                           "apt is available)")
def test_a_real_prometheus_scrapes_and_answers_a_query(held_server, tmp_path):
    # Rule: the text format is one a real Prometheus ingests; its query API answers
    # with the counts the server holds.
    expected = value(samples(held_server), "nv_inference_exec_count")
    assert expected >= 1
    (port,) = free_ports(1)
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n"
        "scrape_configs:\n  - job_name: shmserve\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{held_server.metrics_port}']\n")
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "wb"))
    query = urllib.parse.quote('nv_inference_exec_count{model="delayed_batch",version="1"}')

    def answer():
        try:
            with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/api/v1/query?query={query}", timeout=5) as r:
                result = json.loads(r.read())["data"]["result"]
        except (OSError, KeyError, ValueError):
            return None
        return result or None

    try:
        (series,) = wait_until(answer, 60, 0.5, "Prometheus to scrape the server")
        assert series["metric"]["job"] == "shmserve"
        assert float(series["value"][1]) == expected
    finally:
        proc.terminate()
        proc.wait(30)
