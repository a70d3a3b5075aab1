"""The response cache's logic: the byte-bounded LRU (scheduler/cache.py), the request
key (frontend/cache_key.py), the flags, and how hits and misses count in statistics
and metrics."""

import types

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from frontend.cache_key import cache_key
from frontend.types import DecodedInput, RequestedOutput
from scheduler.cache import ResponseCache, entry_size, parse_cache_config
from scheduler.cli import parse_args
from scheduler.metrics import Metrics
from scheduler.stats import ModelStats
from scheduler.scheduling.queued import Queued
from shm.messages.frontend import InferRequest
from shm.tensor import TensorRef


def out(name, nbytes, fill=0):
    return [TensorRef(name, "UINT8", [nbytes], data=bytes([fill]) * nbytes)]


def size_of(key, nbytes, name="O"):
    return entry_size(key, out(name, nbytes))


# -- the LRU ---------------------------------------------------------------------------

def test_insert_then_lookup_returns_the_outputs_and_accounts_their_size():
    """Rule: an inserted result is found under its key; `used` is its size exactly."""
    c = ResponseCache(1000)
    assert c.lookup(b"k1") is None
    assert c.insert(b"k1", "m", 1, out("O", 100, 7))
    e = c.lookup(b"k1")
    assert e.outputs[0].data == bytes([7]) * 100 and (e.model, e.version) == ("m", 1)
    assert c.used == e.size == size_of(b"k1", 100) == 2 + 1 + 5 + 8 + 100
    assert (c.lookups, c.hits, c.misses) == (2, 1, 1)


def test_eviction_is_least_recently_used_not_first_inserted():
    """Rule: when a new entry does not fit, the least recently *used* entry goes."""
    one = size_of(b"a", 100)
    c = ResponseCache(3 * one)
    for k in (b"a", b"b", b"c"):
        assert c.insert(k, "m", 1, out("O", 100))
    assert c.lookup(b"a") is not None  # a is now the most recently used
    assert c.insert(b"d", "m", 1, out("O", 100))
    assert b"b" not in c and {b"a", b"c", b"d"} == set(c.entries)
    assert c.evictions == 1 and c.used == 3 * one
    assert c.insert(b"e", "m", 1, out("O", 100))
    assert b"c" not in c  # next least recently used


def test_a_big_entry_evicts_as_many_as_it_needs():
    """Rule: eviction continues until the new entry fits; accounting stays exact."""
    small = size_of(b"a", 10)
    c = ResponseCache(3 * small + 5)
    for k in (b"a", b"b", b"c"):
        c.insert(k, "m", 1, out("O", 10))
    big = out("O", 2 * small - size_of(b"x", 0))  # exactly two small entries' worth
    assert c.insert(b"x", "m", 1, big)
    assert set(c.entries) == {b"c", b"x"} and c.evictions == 2
    assert c.used == small + entry_size(b"x", big) <= c.capacity


def test_an_entry_larger_than_the_cache_is_refused_and_evicts_nothing():
    """Rule: a result bigger than the whole cache is not cached, and the cache keeps
    what it had."""
    c = ResponseCache(200)
    assert c.insert(b"a", "m", 1, out("O", 50))
    assert not c.insert(b"huge", "m", 1, out("O", 500))
    assert b"huge" not in c and b"a" in c and c.evictions == 0
    assert c.used == size_of(b"a", 50)


def test_an_entry_exactly_the_capacity_fits():
    c = ResponseCache(size_of(b"a", 64))
    assert c.insert(b"a", "m", 1, out("O", 64)) and c.utilization() == 1.0


def test_inserting_a_cached_key_again_keeps_one_entry():
    """Rule: two concurrent misses of one request both insert; size is counted once."""
    c = ResponseCache(1000)
    c.insert(b"a", "m", 1, out("O", 10))
    c.insert(b"b", "m", 1, out("O", 10))
    assert c.insert(b"a", "m", 1, out("O", 10))
    assert len(c) == 2 and c.used == 2 * size_of(b"a", 10)
    assert list(c.entries) == [b"b", b"a"]  # refreshed


def test_outputs_that_are_not_inline_are_refused():
    c = ResponseCache(1000)
    ref = TensorRef("O", "FP32", [4], segment="seg", offset=0, nbytes=16)
    assert not c.insert(b"a", "m", 1, [ref]) and len(c) == 0


# -- the key ---------------------------------------------------------------------------

def inputs(**over):
    base = dict(name="INPUT0", datatype="FP32", shape=[1, 4],
                data=np.arange(4, dtype=np.float32).tobytes())
    base.update(over)
    return [DecodedInput(**base)]


def key(model="m", version=1, ins=None, outs=None):
    return cache_key(model, version, ins if ins is not None else inputs(), outs)


def test_same_request_same_key_whatever_the_buffer_type():
    """Rule: the key depends on the bytes, not on how the codec holds them."""
    data = np.arange(4, dtype=np.float32).tobytes()
    k = key()
    assert k == key(ins=inputs(data=memoryview(data))) == key(ins=inputs(data=bytearray(data)))
    assert len(k) == 32


@pytest.mark.parametrize("change", [
    dict(model="other"), dict(version=2),
    dict(ins=inputs(name="INPUT1")), dict(ins=inputs(datatype="INT32")),
    dict(ins=inputs(shape=[4, 1])), dict(ins=inputs(shape=[4])),
    dict(ins=inputs(data=np.array([0, 1, 2, 4], np.float32).tobytes())),
    dict(outs=[RequestedOutput("OUTPUT0")]),
])
def test_any_difference_gives_another_key(change):
    """Rule: model, version, and each input's name, datatype, shape and bytes are in
    the key (and the requested outputs)."""
    assert key(**change) != key()


def test_input_order_does_not_matter_but_assignment_does():
    a = DecodedInput("A", "INT8", [2], b"\x01\x02")
    b = DecodedInput("B", "INT8", [2], b"\x03\x04")
    assert key(ins=[a, b]) == key(ins=[b, a])
    swapped = [DecodedInput("A", "INT8", [2], b"\x03\x04"), DecodedInput("B", "INT8", [2],
                                                                         b"\x01\x02")]
    assert key(ins=swapped) != key(ins=[a, b])


def test_field_boundaries_are_unambiguous():
    """Rule: moving a byte from one field to the next changes the key."""
    assert key(ins=[DecodedInput("AB", "INT8", [1], b"\x01")]) != \
        key(ins=[DecodedInput("A", "INT8", [1], b"B\x01")])


def test_requested_output_order_does_not_matter():
    outs = [RequestedOutput("OUTPUT0"), RequestedOutput("OUTPUT1")]
    assert key(outs=outs) == key(outs=outs[::-1])
    assert key(outs=outs) != key(outs=None)


def test_inputs_in_client_shared_memory_are_not_cached():
    """Rule (bypass): a frontend cannot hash bytes it does not hold."""
    ins = inputs() + [DecodedInput("X", "FP32", [4], None, {"shared_memory_region": "r"})]
    assert cache_key("m", 1, ins) is None


# -- flags -----------------------------------------------------------------------------

@pytest.mark.parametrize("argv, size", [
    ([], 0),
    (["--cache-config", "local,size=1048576"], 1048576),
    (["--cache-config=local,size=4096"], 4096),
    (["--response-cache-byte-size", "2048"], 2048),
    (["--response-cache-byte-size", "2048", "--cache-config", "local,size=99"], 99),
])
def test_cache_flags(argv, size):
    """Rule: --cache-config <cache>,<key>=<value> (Triton's syntax); the deprecated
    --response-cache-byte-size N means local,size=N."""
    assert parse_args(["--model-repository", "/x", *argv]).cache_bytes == size


@pytest.mark.parametrize("items, message", [
    (["local"], "format is"), (["redis,host=x"], "only 'local'"),
    (["local,size=abc"], "integer"), (["local,ttl=3"], "unknown setting"),
    (["local,size=-1"], "negative"),
])
def test_bad_cache_config_is_refused(items, message):
    with pytest.raises(ValueError, match=message):
        parse_cache_config(items, None)


# -- statistics and metrics ------------------------------------------------------------

def test_a_hit_counts_as_success_and_cache_hit_never_as_compute():
    """Rule (UpdateSuccessCacheHit): success and queue count a hit, inference_count,
    execution_count and compute phases do not."""
    st = ModelStats("m", 1)
    req = Queued(InferRequest(1, "r", "m", 1, [], start_ns=1_000), queue_ns=1_500)
    st.cache_hit(req, lookup_start_ns=2_000, lookup_end_ns=2_300, end_ns=3_000)
    j = st.as_json()
    inf = j["inference_stats"]
    assert (j["inference_count"], j["execution_count"]) == (0, 0)
    assert inf["success"] == {"count": 1, "ns": 2_000}
    assert inf["queue"] == {"count": 1, "ns": 500}
    assert inf["cache_hit"] == {"count": 1, "ns": 300}
    assert inf["compute_infer"]["count"] == 0 and inf["cache_miss"]["count"] == 0


def test_a_miss_counts_lookup_plus_insertion():
    """Rule (UpdateSuccessCacheMiss): a successful miss is a cache_miss of lookup +
    insertion time; the insertion is added to the request duration."""
    st = ModelStats("m", 1)
    hit_less = Queued(InferRequest(1, "r", "m", 1, [], start_ns=0), queue_ns=10)
    miss = Queued(InferRequest(2, "r", "m", 1, [], start_ns=0, cache_key=b"k"),
                  queue_ns=10, cache_lookup_ns=40)
    failed = Queued(InferRequest(3, "r", "m", 1, [], start_ns=0, cache_key=b"j"),
                    queue_ns=10, cache_lookup_ns=40)
    st.batch_ran([hit_less, miss, failed], [2], [1, 1, 1], 3, 100, 200, 300, 400)
    st.cache_inserted(60)
    inf = st.as_json()["inference_stats"]
    assert inf["cache_miss"] == {"count": 1, "ns": 100}
    assert inf["success"] == {"count": 2, "ns": 800 + 60}
    assert inf["compute_infer"]["count"] == 2


def _metrics(cache_enabled):
    st = ModelStats("m", 1)
    st.cache_enabled = cache_enabled
    st.cache_hit_count, st.cache_hit_ns = 3, 7_000
    st.cache_miss_count, st.cache_miss_ns = 2, 9_000
    sched = types.SimpleNamespace(stats=st, pending=0, waiting_at_instances=0)
    mv = types.SimpleNamespace(name="m", version=1, scheduler=sched)
    manager = types.SimpleNamespace(ready_versions=lambda: [mv], load_seconds={})
    text = Metrics(manager, {}, cpu=False).render().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_cache_metrics_carry_tritons_names_for_models_that_cache():
    fams = _metrics(True)
    value = {name: fams[name].samples[0].value for name in (
        "nv_cache_num_hits_per_model", "nv_cache_num_misses_per_model",
        "nv_cache_hit_duration_per_model", "nv_cache_miss_duration_per_model")}
    assert value == {"nv_cache_num_hits_per_model": 3, "nv_cache_num_misses_per_model": 2,
                     "nv_cache_hit_duration_per_model": 7,
                     "nv_cache_miss_duration_per_model": 9}
    assert fams["nv_cache_num_hits_per_model"].samples[0].labels == {"model": "m",
                                                                     "version": "1"}
    assert not any(name.startswith("nv_cache") for name in _metrics(False))

