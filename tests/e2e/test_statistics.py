"""The statistics extension, end to end: both protocols report the one set of counters,
every model is listed, and bad calls are Triton's errors. How batches, failures and
times are counted is proved in the scheduler's loop (tests/loop/test_scheduling.py)."""

import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.e2e.clients import PROTOCOLS, client, infer_input
from tests.e2e.harness import wait_until

pytestmark = pytest.mark.e2e


def stats(server, protocol, model="", version=""):
    """The model_stats entries as plain numbers, whichever protocol asked."""
    c = client(server, protocol)
    out = {}
    if protocol == "http":
        for m in c.get_inference_statistics(model, version)["model_stats"]:
            inf = m["inference_stats"]
            out[(m["name"], m["version"])] = {
                "last_inference": m["last_inference"],
                "inference_count": m["inference_count"],
                "execution_count": m["execution_count"],
                **{k: (v["count"], v["ns"]) for k, v in inf.items()},
                "batch_stats": {b["batch_size"]: b["compute_infer"]["count"]
                                for b in m["batch_stats"]},
            }
        return out
    for m in c.get_inference_statistics(model, version).model_stats:
        inf = m.inference_stats
        out[(m.name, m.version)] = {
            "last_inference": m.last_inference,
            "inference_count": m.inference_count,
            "execution_count": m.execution_count,
            **{k: (getattr(inf, k).count, getattr(inf, k).ns)
               for k in ("success", "fail", "queue", "compute_input", "compute_infer",
                         "compute_output", "cache_hit", "cache_miss")},
            "batch_stats": {b.batch_size: b.compute_infer.count for b in m.batch_stats},
        }
    return out


def test_one_set_of_counters_whichever_protocol_and_frontend_asks(server):
    """Rule: requests through either protocol (and either frontend) count in the one
    model's statistics, and both protocols report them alike: counts, times and
    last_inference. (How batches, failures and times are counted is the scheduler's:
    tests/loop/test_scheduling.py; the real model's time in compute_infer is e2e
    test_metrics.py's.)"""
    key = ("identity_fp32", "1")
    before = stats(server, "http", "identity_fp32")[key]
    start_ms = time.time() * 1000
    x = np.ones((1, 16), dtype=np.float32)
    for protocol in PROTOCOLS * 2:
        client(server, protocol).infer("identity_fp32",
                                       [infer_input(protocol, "INPUT0", x, "FP32")])
    # a client has its answer before the scheduler hears the batch is done (the worker
    # answers first): wait until all four are counted
    wait_until(lambda: stats(server, "http", "identity_fp32")[key]["success"][0] ==
               before["success"][0] + 4, 30, what="the requests counted")
    by_http = stats(server, "http", "identity_fp32")
    by_grpc = stats(server, "grpc", "identity_fp32", "1")
    assert by_http == by_grpc
    s = by_http[key]
    assert s["inference_count"] == before["inference_count"] + 4
    assert s["compute_infer"][1] > before["compute_infer"][1]
    assert start_ms - 1000 <= s["last_inference"] <= time.time() * 1000 + 1000


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_all_models_listed_and_bad_calls_are_tritons_errors(server, protocol):
    c = client(server, protocol)
    everything = stats(server, protocol)
    assert ("identity_fp32", "1") in everything and ("add_sub", "1") in everything
    assert list(everything) == sorted(everything)
    before = stats(server, protocol, "add_sub")
    # Rule (TRITONSERVER_ServerModelStatistics): unknown model / version -> INVALID_ARG
    for model, version, message in [
            ("no_such_model", "", "requested model 'no_such_model' is not available"),
            ("add_sub", "7", "requested model version is not available for model 'add_sub'")]:
        with pytest.raises(InferenceServerException) as exc:
            c.get_inference_statistics(model, version)
        assert message in exc.value.message()
        if protocol == "grpc":
            assert exc.value.status() == "StatusCode.INVALID_ARGUMENT"
        else:
            assert exc.value.status() == "400"
    assert stats(server, protocol, "add_sub") == before  # bad calls count nowhere


def test_http_statistics_routes(server):
    import json
    import urllib.error
    import urllib.request

    base = f"http://{server.http_url}/v2/models"
    with urllib.request.urlopen(f"{base}/add_sub/versions/1/stats", timeout=10) as r:
        body = json.loads(r.read())
    assert [m["name"] for m in body["model_stats"]] == ["add_sub"]
    assert set(body["model_stats"][0]) >= {"name", "version", "last_inference",
                                           "inference_count", "execution_count",
                                           "inference_stats", "batch_stats",
                                           "response_stats", "memory_usage"}
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(f"{base}/add_sub/versions/x/stats", timeout=10)
    assert exc.value.code == 400
    assert "error" in json.loads(exc.value.read())


def test_grpc_statistics_message_type(server):
    resp = grpcclient.InferenceServerClient(server.grpc_url).get_inference_statistics(
        "identity_fp32")
    assert resp.model_stats[0].name == "identity_fp32"
