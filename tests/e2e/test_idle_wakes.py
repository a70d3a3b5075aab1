"""Issue 23: a batch's end (BatchDone) wakes the scheduler only when something waits
on it. At c=1 the next request's wake reads it; what needs it at once still gets it:
a request queued for the busy instance, a version draining for an unload, statistics
and metrics asked right after the requests."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import shutil
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.e2e.harness import EXAMPLES, MODELS, ServerProcess, wait_until

N = 40


@pytest.fixture
def server(tmp_path):
    # slow_parallel's model with one instance: a second request must queue
    repo = tmp_path / "repo"
    (repo / "slow_one" / "1").mkdir(parents=True)
    shutil.copy(MODELS / "slow_parallel" / "1" / "model.py", repo / "slow_one" / "1")
    config = (MODELS / "slow_parallel" / "config.pbtxt").read_text()
    (repo / "slow_one" / "config.pbtxt").write_text(
        config.replace('"slow_parallel"', '"slow_one"').replace("count: 2", "count: 1"))
    markers = tmp_path / "markers"
    markers.mkdir()
    counts = tmp_path / "wakes.json"
    srv = ServerProcess([EXAMPLES, repo], "--model-control-mode", "explicit",
                        "--load-model", "identity_fp32", "--load-model", "slow_one",
                        "--exit-timeout-secs", "60",
                        env={"SHMSERVE_WAKE_COUNTS": str(counts),
                             "SHMSERVE_TEST_MARKER_DIR": str(markers)}).start()
    srv.markers, srv.counts = markers, counts
    try:
        yield srv
    finally:
        srv.stop()


def identity(client, value: float):
    inp = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    inp.set_data_from_numpy(np.full((1, 16), value, dtype=np.float32))
    out = client.infer("identity_fp32", [inp]).as_numpy("OUTPUT0")
    assert (out == value).all()


def slow(client, delay_ms: int):
    inp = httpclient.InferInput("DELAY_MS", [1], "INT32")
    inp.set_data_from_numpy(np.array([delay_ms], dtype=np.int32))
    return client.infer("slow_one", [inp]).as_numpy("SPAN")


def metric(server, name: str, model: str) -> float:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    for line in urllib.request.urlopen(url, timeout=10).read().decode().splitlines():
        if line.startswith(name + "{") and f'model="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} for {model}")


def test_c1_requests_end_quietly_and_are_counted_at_once(server):
    client = httpclient.InferenceServerClient(server.http_url)
    for i in range(N):
        identity(client, float(i))
    # asked right after the last response: every batch is counted (the scrape and the
    # statistics call read the BatchDones still unread first)
    assert metric(server, "nv_inference_exec_count", "identity_fp32") == N
    assert metric(server, "nv_inference_request_success", "identity_fp32") == N
    stats = client.get_inference_statistics("identity_fp32")["model_stats"][0]
    assert stats["inference_count"] == N and stats["execution_count"] == N
    assert stats["inference_stats"]["success"]["count"] == N
    for i in range(N):
        identity(client, float(i))
    # stopped right after: the batches whose BatchDone was not read yet are counted
    # as run, not failed as still running
    server.stop_checked()
    assert f"model 'identity_fp32' version 1: {2 * N} rows in {2 * N} batches" in server.log()
    wakes = json.loads(server.counts.read_text())
    # every batch ended in the quiet inbox, and nearly none of them woke the loop (one
    # may when the next request comes before its BatchDone, and waits for it)
    assert wakes.get("quiet BatchDone", 0) == wakes["BatchDone"] >= 2 * N
    assert wakes.get("quiet inbox wake", 0) <= N // 2, wakes


def test_a_queued_request_and_an_unload_are_woken_by_the_batch_end(server):
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=30)
    running = server.markers

    def started() -> bool:
        return any(p.name.startswith("running-") for p in running.iterdir())

    with cf.ThreadPoolExecutor(2) as pool:
        first = pool.submit(slow, httpclient.InferenceServerClient(server.http_url), 1500)
        wait_until(started, 30, what="the first request running")
        # queued behind it: only the first batch's end can send it on
        second = pool.submit(slow, httpclient.InferenceServerClient(server.http_url), 0)
        first_span, second_span = first.result(30), second.result(30)
        assert second_span[0] >= first_span[1]
        for p in running.iterdir():
            os.unlink(p)
        # an unload waits for the batch that runs, and hears of its end at once (not
        # after --exit-timeout-secs, 60 s, past this client's 30 s)
        third = pool.submit(slow, httpclient.InferenceServerClient(server.http_url), 1500)
        wait_until(started, 30, what="the third request running")
        client.unload_model("slow_one")
        assert third.result(30)[1] > 0
    assert not client.is_model_ready("slow_one")
    server.stop_checked()
