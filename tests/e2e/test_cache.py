"""The response cache, end to end, over HTTP and gRPC: hits skip the model (counted by
the model itself and by statistics), LRU eviction under a small `--cache-config
local,size=...`, the decoupled model Triton refuses, and /metrics.

One frontend process: the CacheInsert a miss sends and the client's next request go
down the same channel in order, so the next request sees the entry (no waiting)."""

import urllib.request
import uuid

import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.e2e.clients import PROTOCOLS, client, infer_input, module, requested
from tests.e2e.harness import ROOT, ServerProcess, wait_until

pytestmark = pytest.mark.e2e

MODELS_CACHE = ROOT / "tests" / "models_cache"
N = 32 * 1024  # FP32 elements per request: 128 KiB, so tensors travel through arenas
ENTRY = 2 * 4 * N  # two outputs of N FP32
CACHE_BYTES = ENTRY * 5 // 2  # two entries fit, three do not
DECOUPLED_MESSAGE = ("Response Cache does not currently support model decoupled_cached "
                     "with 'decoupled' transaction policy. Please disable the response "
                     "cache.")


@pytest.fixture(scope="module")
def cache_server(tmp_path_factory):
    markers = tmp_path_factory.mktemp("cache-markers")
    srv = ServerProcess(MODELS_CACHE, "--cache-config", f"local,size={CACHE_BYTES}",
                        "--exit-on-error=false", "--strict-readiness=false",
                        "--allow-client-shm=true", frontends=1,
                        log_dir=tmp_path_factory.mktemp("cache-logs"),
                        env={"SHMSERVE_TEST_MARKER_DIR": str(markers)})
    srv.markers = markers
    yield from srv.serve()


def executions(server, model="cached_add") -> int:
    path = server.markers / f"{model}.executions"
    return len(path.read_text().splitlines()) if path.exists() else 0


def stats(server, protocol, model="cached_add"):
    c = client(server, protocol)
    if protocol == "http":
        (m,) = c.get_inference_statistics(model)["model_stats"]
        inf = m["inference_stats"]
        counts = {k: (v["count"], v["ns"]) for k, v in inf.items()}
        return {"inference_count": m["inference_count"],
                "execution_count": m["execution_count"], **counts}
    (m,) = c.get_inference_statistics(model).model_stats
    inf = m.inference_stats
    return {"inference_count": m.inference_count, "execution_count": m.execution_count,
            **{k: (getattr(inf, k).count, getattr(inf, k).ns)
               for k in ("success", "fail", "queue", "compute_input", "compute_infer",
                         "compute_output", "cache_hit", "cache_miss")}}


def settled(server, protocol, model="cached_add"):
    """Statistics once every executed request's batch is counted (BatchDone reaches
    the scheduler on its own channel, possibly after the response)."""
    return wait_until(lambda: (lambda s: s if s["execution_count"] == executions(
        server, model) else None)(stats(server, protocol, model)), 30, what="statistics")


def run(server, protocol, x, model="cached_add", outputs=None):
    c = client(server, protocol)
    reqs = [requested(protocol, o) for o in outputs] if outputs else None
    r = c.infer(model, [infer_input(protocol, "INPUT0", x, "FP32")], outputs=reqs)
    return {name: r.as_numpy(name) for name in (outputs or ("OUTPUT0", "OUTPUT1"))}


def data(seed, n=N):
    return np.random.default_rng(seed).standard_normal((1, n)).astype(np.float32)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_repeated_request_is_a_hit_and_skips_the_model(cache_server, protocol):
    """Rule: the same model, version and inputs hit; the model does not run again
    (execution_count, inference_count unchanged), cache_hit counts it, the outputs are
    identical; a different input is a miss and runs."""
    x = data(PROTOCOLS.index(protocol))
    before = settled(cache_server, protocol)
    ran = executions(cache_server)
    first = run(cache_server, protocol, x)
    np.testing.assert_array_equal(first["OUTPUT0"], x + 1)
    np.testing.assert_array_equal(first["OUTPUT1"], x * 2)
    after_miss = settled(cache_server, protocol)
    assert executions(cache_server) == ran + 1
    assert after_miss["cache_miss"][0] == before["cache_miss"][0] + 1
    assert after_miss["cache_miss"][1] > before["cache_miss"][1]

    again = run(cache_server, protocol, x.copy())
    for name in first:
        np.testing.assert_array_equal(again[name], first[name])
        assert again[name].dtype == first[name].dtype and again[name].shape == (1, N)
    hit = stats(cache_server, protocol)  # a hit is counted before it is answered
    assert executions(cache_server) == ran + 1
    assert hit["execution_count"] == after_miss["execution_count"]
    assert hit["inference_count"] == after_miss["inference_count"]
    assert hit["cache_hit"][0] == after_miss["cache_hit"][0] + 1
    assert hit["cache_hit"][1] > after_miss["cache_hit"][1]
    assert hit["success"][0] == after_miss["success"][0] + 1
    assert hit["compute_infer"][0] == after_miss["compute_infer"][0]  # hits never compute
    assert hit["cache_miss"] == after_miss["cache_miss"]

    x2 = x.copy()
    x2[0, -1] += 1  # one element differs
    other = run(cache_server, protocol, x2)
    np.testing.assert_array_equal(other["OUTPUT0"], x2 + 1)
    assert executions(cache_server) == ran + 2
    assert settled(cache_server, protocol)["cache_miss"][0] == before["cache_miss"][0] + 2


def test_one_cache_for_every_protocol_and_encoding(cache_server):
    """Rule: the key is the request's content, not its wire form: a result computed for
    an HTTP JSON request answers the same request in HTTP binary and over gRPC."""
    x = data(7000, 8)
    ran = executions(cache_server)
    c = client(cache_server, "http")
    r = c.infer("cached_add", [infer_input("http", "INPUT0", x, "FP32", binary=False)],
                outputs=[requested("http", o, binary=False) for o in ("OUTPUT0", "OUTPUT1")])
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), x + 1)
    assert executions(cache_server) == ran + 1
    for protocol in PROTOCOLS:
        np.testing.assert_array_equal(run(cache_server, protocol, x)["OUTPUT1"], x * 2)
    assert executions(cache_server) == ran + 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_requested_outputs_are_honoured(cache_server, protocol):
    """Rule: a hit answers exactly the outputs the request asked for: a request for one
    output does not answer a later request for both with one."""
    x = data(1000 + PROTOCOLS.index(protocol), 16)
    ran = executions(cache_server)
    only0 = run(cache_server, protocol, x, outputs=("OUTPUT0",))
    assert set(only0) == {"OUTPUT0"}
    both = run(cache_server, protocol, x)
    np.testing.assert_array_equal(both["OUTPUT1"], x * 2)
    assert executions(cache_server) == ran + 2
    assert set(run(cache_server, protocol, x, outputs=("OUTPUT0",))) == {"OUTPUT0"}
    assert executions(cache_server) == ran + 2  # that one was a hit


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_small_cache_evicts_the_least_recently_used(cache_server, protocol):
    """Rule: the cache is bounded by bytes; inserting past it evicts the least recently
    used entry: a then b cached, a used again, c inserted -> b (not a) is gone, which
    shows as b's hit turning into a miss."""
    a, b, c = (data(2000 + 10 * PROTOCOLS.index(protocol) + i) for i in range(3))
    ran = executions(cache_server)
    run(cache_server, protocol, a)
    run(cache_server, protocol, b)
    run(cache_server, protocol, a)  # hit: a is now the most recently used
    assert executions(cache_server) == ran + 2
    run(cache_server, protocol, c)  # does not fit beside a and b: b goes
    assert executions(cache_server) == ran + 3
    np.testing.assert_array_equal(run(cache_server, protocol, a)["OUTPUT0"], a + 1)
    assert executions(cache_server) == ran + 3  # a still cached
    np.testing.assert_array_equal(run(cache_server, protocol, b)["OUTPUT1"], b * 2)
    assert executions(cache_server) == ran + 4  # b was evicted: a miss, executed


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_model_without_response_cache_always_runs(cache_server, protocol):
    """Rule: caching is per model: without response_cache enable, nothing is cached
    even with a server cache."""
    x = data(3000 + PROTOCOLS.index(protocol), 8)
    ran = executions(cache_server, "uncached_add")
    for _ in range(2):
        run(cache_server, protocol, x, model="uncached_add")
    assert executions(cache_server, "uncached_add") == ran + 2
    s = settled(cache_server, protocol, "uncached_add")
    assert s["cache_hit"][0] == 0 and s["cache_miss"][0] == 0


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_decoupled_model_with_cache_fails_to_load(cache_server, protocol):
    """Rule (Triton's model config validation): response_cache with a decoupled
    transaction policy fails the load, with Triton's message."""
    c = client(cache_server, protocol)
    assert not c.is_model_ready("decoupled_cached")
    with pytest.raises(InferenceServerException) as exc:
        c.infer("decoupled_cached", [infer_input(protocol, "IN", np.ones(1, np.int32),
                                                 "INT32")])
    assert DECOUPLED_MESSAGE in exc.value.message()
    assert DECOUPLED_MESSAGE in cache_server.log()


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("where", ["input", "output"])
def test_client_shared_memory_bypasses_the_cache(cache_server, protocol, where):
    """Rule (shmserve's choice, README): a request with an input or an output in a
    client shared-memory region is neither looked up nor cached: it runs every time
    and its results land in the region as usual."""
    x = data(6000 + PROTOCOLS.index(protocol), 64)
    nbytes = x.nbytes
    key = f"/cachetest-{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region(key[1:], key, 3 * nbytes)
    c = client(cache_server, protocol)
    mod = module(protocol)
    try:
        c.register_system_shared_memory(key[1:], key, 3 * nbytes)
        shm.set_shared_memory_region(handle, [x])
        before = stats(cache_server, protocol)
        ran = executions(cache_server)
        for _ in range(2):
            inp = mod.InferInput("INPUT0", list(x.shape), "FP32")
            if where == "input":
                inp.set_shared_memory(key[1:], nbytes)
            else:
                inp.set_data_from_numpy(x)
            out = mod.InferRequestedOutput("OUTPUT0")
            if where == "output":
                out.set_shared_memory(key[1:], nbytes, offset=nbytes)
            r = c.infer("cached_add", [inp], outputs=[out])
            if where == "output":
                got = shm.get_contents_as_numpy(handle, np.float32, list(x.shape),
                                                offset=nbytes)
            else:
                got = r.as_numpy("OUTPUT0")
            np.testing.assert_array_equal(got, x + 1)
        assert executions(cache_server) == ran + 2
        after = settled(cache_server, protocol)
        assert after["cache_hit"][0] == before["cache_hit"][0]
        assert after["cache_miss"][0] == before["cache_miss"][0]
    finally:
        c.unregister_system_shared_memory(key[1:])
        shm.destroy_shared_memory_region(handle)


def test_metrics_show_the_cache_counters(cache_server):
    """Rule (metrics.md): nv_cache_num_hits/misses_per_model and their durations, for
    models that cache, agreeing with the statistics extension; none for a model
    that does not cache."""
    x = data(4000, 4)
    run(cache_server, "http", x)
    run(cache_server, "grpc", x)
    s = settled(cache_server, "http")
    with urllib.request.urlopen(f"http://127.0.0.1:{cache_server.metrics_port}/metrics",
                                timeout=10) as r:
        text = r.read().decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}

    def value(name, model="cached_add"):
        (v,) = [x.value for x in fams[name].samples if x.labels["model"] == model]
        return v

    assert value("nv_cache_num_hits_per_model") == s["cache_hit"][0] >= 1
    assert value("nv_cache_num_misses_per_model") == s["cache_miss"][0] >= 1
    assert value("nv_cache_hit_duration_per_model") == s["cache_hit"][1] // 1000
    assert value("nv_cache_miss_duration_per_model") == s["cache_miss"][1] // 1000
    assert fams["nv_cache_num_hits_per_model"].type == "counter"
    assert not [x for x in fams["nv_cache_num_hits_per_model"].samples
                if x.labels["model"] == "uncached_add"]
    # hits are not inferences (Triton: nv_inference_count excludes cached requests)
    assert value("nv_inference_count") == s["inference_count"]
    assert value("nv_inference_request_success") == s["success"][0]


def test_without_a_server_cache_the_model_is_served_uncached(tmp_path):
    """Rule: response_cache enable without --cache-config loads and serves the model,
    uncached (Triton needs both), and shows no cache metrics."""
    markers = tmp_path / "markers"
    markers.mkdir()
    srv = ServerProcess(MODELS_CACHE, "--model-control-mode=explicit",
                        "--load-model", "cached_add", log_dir=tmp_path,
                        env={"SHMSERVE_TEST_MARKER_DIR": str(markers)})
    srv.markers = markers
    with srv:
        x = data(5000, 8)
        for protocol in PROTOCOLS:
            np.testing.assert_array_equal(run(srv, protocol, x)["OUTPUT0"], x + 1)
        assert executions(srv) == 2
        s = settled(srv, "grpc")
        assert s["cache_hit"][0] == s["cache_miss"][0] == 0
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics",
                                    timeout=10) as r:
            assert b"nv_cache_num_hits_per_model" not in r.read()
    assert srv.proc.returncode == 0, srv.log()
    assert srv.segments() == []
