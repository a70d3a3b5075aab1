"""/metrics text as Prometheus reads it: Triton's names, help texts, labels and types,
read back with prometheus_client's parser."""

import types

import pytest
from prometheus_client.parser import text_string_to_metric_families

from scheduler.metrics import Metrics, parse_metrics_config
from scheduler.scheduling.queued import Queued
from scheduler.stats import ModelStats
from shm.messages.frontend import InferRequest


class _Scheduler:
    def __init__(self, name):
        self.stats = ModelStats(name, 1)
        # Triton's pending count: queued here, and waiting at a busy instance's worker
        self.pending = 2
        self.waiting_at_instances = 1


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


class _FakeNvml:
    """NVML as pynvml exposes it, for one GPU (no GPU on the CI machine)."""

    def __init__(self):
        self.energy_mj = 5_000

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("handle", i)

    def nvmlDeviceGetUUID(self, handle):
        return b"GPU-0000"

    def nvmlDeviceGetUtilizationRates(self, handle):
        return types.SimpleNamespace(gpu=37)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return types.SimpleNamespace(total=80 << 30, used=3 << 30)

    def nvmlDeviceGetPowerUsage(self, handle):
        return 71_500  # mW

    def nvmlDeviceGetPowerManagementLimit(self, handle):
        raise RuntimeError("not supported")

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        return self.energy_mj


def test_gpu_metrics_per_gpu_uuid_in_tritons_units(monkeypatch):
    nvml = _FakeNvml()
    monkeypatch.setitem(__import__("sys").modules, "pynvml", nvml)
    metrics = Metrics(_manager(), {}, cpu=False, gpu=True)
    nvml.energy_mj += 2_500  # 2.5 J since the server started
    metrics.sample()
    fams = _families(metrics.render())
    label = {"gpu_uuid": "GPU-0000"}

    def gpu(name):
        (s,) = fams[name].samples
        assert s.labels == label
        return s.value

    assert gpu("nv_gpu_utilization") == 0.37
    assert gpu("nv_gpu_memory_total_bytes") == 80 << 30
    assert gpu("nv_gpu_memory_used_bytes") == 3 << 30
    assert gpu("nv_gpu_power_usage") == 71.5  # watts
    assert gpu("nv_energy_consumption") == 2.5  # joules since start
    assert "nv_gpu_power_limit" not in fams  # a reading the GPU lacks is left out


def test_no_gpu_metrics_without_nvml(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)  # import fails
    fams = _families(Metrics(_manager(), {}, cpu=False, gpu=True).render())
    assert not [f for f in fams if f.startswith("nv_gpu") or f == "nv_energy_consumption"]


@pytest.mark.gpu
def test_gpu_metrics_from_the_real_nvml():
    pytest.importorskip("pynvml")
    from scheduler.metrics import GpuSampler
    sampler = GpuSampler()
    if not sampler.devices:
        pytest.skip("no GPU visible to NVML")
    fams = _families(Metrics(_manager(), {}, cpu=False, gpu=True).render())
    total = fams["nv_gpu_memory_total_bytes"].samples
    assert len(total) == len(sampler.devices) and all(s.value > 0 for s in total)
    assert all(s.labels["gpu_uuid"].startswith("GPU-") for s in total)


def test_a_batch_observes_each_request_in_the_histograms():
    """batch_ran files each request's duration under request_ms and
    first_response_ms, and its queue time under queue_ms (in milliseconds)."""
    st = ModelStats("m", 1)
    quick = Queued(InferRequest(1, "r", "m", 1, [], start_ns=0), queue_ns=100_000)
    slow = Queued(InferRequest(2, "r", "m", 1, [], start_ns=0), queue_ns=0)
    # the batch ran from 0.3 ms to 2 ms after both started
    st.batch_ran([quick, slow], [], [1, 1], 2, 300_000, 400_000, 500_000, 2_000_000)
    bounds = st.request_ms.bounds
    for hist in (st.request_ms, st.first_response_ms):
        assert hist.sum == pytest.approx(4.0)
        assert hist.counts[bounds.index(2.5)] == 2 and sum(hist.counts) == 2
    assert st.queue_ms.sum == pytest.approx(0.2 + 0.3)
    assert st.queue_ms.counts[bounds.index(0.25)] == 1  # 0.2 ms
    assert st.queue_ms.counts[bounds.index(0.5)] == 1  # 0.3 ms
    assert st.compute_ms.sum == pytest.approx(1.7)
