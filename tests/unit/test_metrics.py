"""/metrics text as Prometheus reads it: Triton's names, help texts, labels and types,
read back with prometheus_client's parser."""

import types

import pytest
from prometheus_client.parser import text_string_to_metric_families

from scheduler.metrics import Metrics, parse_metrics_config
from scheduler.stats import ModelStats


class _Scheduler:
    def __init__(self, name):
        self.stats = ModelStats(name, 1)
        self.pending = 3


def _manager():
    sched = _Scheduler('we"ird\\name')
    st = sched.stats
    st.success_count, st.inference_count, st.execution_count = 5, 9, 2
    st.success_ns, st.queue_ns = 7_000_000, 1_500_000
    st.compute_input_ns, st.compute_infer_ns, st.compute_output_ns = 10_000, 20_000, 30_000
    st.failures["BACKEND"] = 2
    for ms in (0.05, 0.3, 7.0):
        st.first_response_ms.observe(ms)
    mv = types.SimpleNamespace(name=st.name, version=1, scheduler=sched)
    return types.SimpleNamespace(ready_versions=lambda: [mv],
                                 load_seconds={(st.name, 1): 1.25})


def _families(text: bytes):
    return {f.name: f for f in text_string_to_metric_families(text.decode())}


def test_counters_keep_tritons_names_without_a_total_suffix():
    text = Metrics(_manager(), {}, cpu=False).render()
    assert b"nv_inference_request_success{" in text
    assert b"_total" not in text
    fams = _families(text)
    success = fams["nv_inference_request_success"]
    assert success.type == "counter"
    assert success.documentation == "Number of successful inference requests, all batch sizes"
    (sample,) = success.samples
    assert sample.labels == {"model": 'we"ird\\name', "version": "1"}  # escaped, read back
    assert sample.value == 5


def test_values_and_labels_of_each_family():
    fams = _families(Metrics(_manager(), {}, cpu=False).render())

    def value(name, **labels):
        (s,) = [s for s in fams[name].samples if all(s.labels.get(k) == v
                                                     for k, v in labels.items())]
        return s.value

    assert value("nv_inference_count") == 9
    assert value("nv_inference_exec_count") == 2
    assert value("nv_inference_request_duration_us") == 7000
    assert value("nv_inference_queue_duration_us") == 1500
    assert value("nv_inference_compute_input_duration_us") == 10
    assert value("nv_inference_compute_infer_duration_us") == 20
    assert value("nv_inference_compute_output_duration_us") == 30
    assert value("nv_inference_pending_request_count") == 3
    assert fams["nv_inference_pending_request_count"].type == "gauge"
    assert value("nv_model_load_duration_secs") == 1.25
    # every reason Triton reports, zero or not
    assert {s.labels["reason"]: s.value for s in fams["nv_inference_request_failure"].samples} \
        == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 2, "OTHER": 0}
    hist = fams["nv_inference_first_response_histogram_ms"]
    assert hist.type == "histogram"
    buckets = {s.labels["le"]: s.value for s in hist.samples if s.name.endswith("_bucket")}
    assert buckets["0.1"] == 1 and buckets["0.5"] == 2 and buckets["+Inf"] == 3
    count = [s.value for s in hist.samples if s.name.endswith("_count")]
    assert count == [3]


def test_metrics_config_turns_latency_families_off():
    fams = _families(Metrics(_manager(), {"counter_latencies": "false",
                                          "histogram_latencies": "false"}, cpu=False).render())
    assert "nv_inference_request_duration_us" not in fams
    assert "nv_inference_first_response_histogram_ms" not in fams
    assert "nv_inference_request_success" in fams


def test_cpu_metrics():
    fams = _families(Metrics(_manager(), {}, cpu=True).render())
    assert 0.0 <= fams["nv_cpu_utilization"].samples[0].value <= 1.0
    total = fams["nv_cpu_memory_total_bytes"].samples[0].value
    used = fams["nv_cpu_memory_used_bytes"].samples[0].value
    assert 0 < used <= total


def test_metrics_config_format():
    assert parse_metrics_config(["histogram_latencies=false"]) == {
        "histogram_latencies": "false"}
    with pytest.raises(ValueError, match="<setting>=<value>"):
        parse_metrics_config(["nonsense"])
