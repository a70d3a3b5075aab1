"""The statistics extension, end to end: exact batch formation through execution_count,
inference_count and batch_stats (Triton's own tests prove batching this way), timings
taken in the right places, and Triton's errors. The batcher is held with Triton's
TRITONSERVER_DELAY_SCHEDULER hook, so batches form exactly, not by timing."""

import concurrent.futures as cf
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.e2e.clients import PROTOCOLS, client, infer_input
from tests.e2e.conftest import HOLD
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


def infer(server, protocol, value):
    x = np.full((1, 4), value, dtype=np.float32)
    r = client(server, protocol).infer("delayed_batch",
                                       [infer_input(protocol, "INPUT0", x, "FP32")])
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), x)


def test_held_batcher_forms_one_batch_and_statistics_count_it_exactly(held_server):
    # Rule: execution_count counts executions, inference_count batch items, batch_stats
    # executions by total batch size; success/queue/compute count successful requests.
    start_ms = time.time() * 1000
    with cf.ThreadPoolExecutor(HOLD) as pool:
        list(pool.map(lambda i: infer(held_server, PROTOCOLS[i % 2], i), range(HOLD),
                      timeout=60))
    # a client has its answer before the scheduler hears the batch is done (the
    # worker answers first): wait until the batch is counted
    wait_until(lambda: stats(held_server, "http", "delayed_batch")[
        ("delayed_batch", "1")]["execution_count"] == 1, 30, what="the batch counted")
    by_http = stats(held_server, "http", "delayed_batch")
    by_grpc = stats(held_server, "grpc", "delayed_batch", "1")
    assert by_http == by_grpc  # one set of counters, whichever frontend asks
    s = by_http[("delayed_batch", "1")]
    assert s["execution_count"] == 1
    assert s["inference_count"] == HOLD
    assert s["batch_stats"] == {HOLD: 1}
    assert s["success"][0] == s["queue"][0] == s["compute_infer"][0] == HOLD
    assert s["fail"] == (0, 0) and s["cache_hit"] == (0, 0)
    # each request's compute_infer holds the model's 20 ms sleep, and the request's
    # whole duration holds its queue and compute phases
    assert s["compute_infer"][1] >= HOLD * 20_000_000
    assert s["success"][1] >= (s["queue"][1] + s["compute_input"][1] + s["compute_infer"][1]
                               + s["compute_output"][1])
    assert start_ms - 1000 <= s["last_inference"] <= time.time() * 1000 + 1000

    # Rule: a request the backend fails counts in fail, not in inference_count; the
    # execution still counts.
    with pytest.raises(InferenceServerException, match="negative input"):
        infer(held_server, "grpc", -1)
    infer(held_server, "http", 5)
    wait_until(lambda: stats(held_server, "grpc", "delayed_batch")[
        ("delayed_batch", "1")]["execution_count"] == 3, 30, what="both batches counted")
    s = stats(held_server, "grpc", "delayed_batch")[("delayed_batch", "1")]
    assert s["execution_count"] == 3
    assert s["inference_count"] == HOLD + 1
    assert s["batch_stats"] == {1: 2, HOLD: 1}
    assert s["success"][0] == HOLD + 1
    assert s["fail"][0] == 1 and s["fail"][1] > 0


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
