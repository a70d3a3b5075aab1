"""The pure parts of scripts/bench.py and scripts/compare.py: no server needed."""

import json
import math
import os
import sys
import time

import pytest

SCRIPTS = os.path.join(os.path.dirname(__file__), "..", "..", "scripts")
sys.path.insert(0, os.path.abspath(SCRIPTS))

import bench  # noqa: E402
import compare  # noqa: E402


# --- lists and shapes -------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("1", [1]), ("1,4,16", [1, 4, 16]), (" 2 , 8 ", [2, 8]), ("4,", [4]),
])
def test_parse_int_list(text, expected):
    assert bench.parse_int_list(text) == expected


@pytest.mark.parametrize("text", ["", ",", "0", "1,-2", "a", "1.5"])
def test_parse_int_list_rejects(text):
    with pytest.raises(ValueError):
        bench.parse_int_list(text)


@pytest.mark.parametrize("text, expected", [
    ("1,16", [1, 16]), ("1x262144", [1, 262144]), ("[1, 16]", [1, 16]), ("16", [16]),
    ("(2,3,4)", [2, 3, 4]),
])
def test_parse_shape(text, expected):
    assert bench.parse_shape(text) == expected


def test_parse_shape_rejects_zero_dim():
    with pytest.raises(ValueError):
        bench.parse_shape("1,0")


def test_cli_parses_lists_and_defaults():
    args = bench.build_parser().parse_args(
        ["--protocol", "http", "--shape", "1,16", "--shape", "1x262144",
         "--concurrency", "1,4,16", "--shm", "system", "--json", "/tmp/x.json"])
    cfg = bench.config_from_args(args)
    assert cfg.shapes == [[1, 16], [1, 262144]]
    assert cfg.concurrency == [1, 4, 16]
    assert cfg.url == "127.0.0.1:8000"  # the protocol's default port
    assert cfg.shm == "system" and cfg.dtype == "FP32"
    assert cfg.input_name == "INPUT0" and cfg.output_name == "OUTPUT0"
    assert cfg.verify is True  # identity model by default
    assert cfg.client_processes == 1
    assert cfg.client_impl() == bench.DEFAULT_IMPL["http"]


def test_cli_defaults_and_verify_switch():
    p = bench.build_parser()
    cfg = bench.config_from_args(p.parse_args(["--model", "add_sub"]))
    assert cfg.shapes == [[1, 16]] and cfg.concurrency == [1]
    assert cfg.url == "127.0.0.1:8001" and cfg.protocol == "grpc"
    assert cfg.verify is False  # not an identity model
    cfg = bench.config_from_args(p.parse_args(["--model", "add_sub", "--verify"]))
    assert cfg.verify is True
    cfg = bench.config_from_args(p.parse_args(["--no-verify"]))
    assert cfg.verify is False


def test_cli_cuda_shm_options():
    p = bench.build_parser()
    cfg = bench.config_from_args(p.parse_args(["--shm", "cuda", "--cuda-device", "1"]))
    assert cfg.shm == "cuda" and cfg.cuda_device == 1
    with pytest.raises(SystemExit):
        p.parse_args(["--shm", "gpu"])


def test_cli_rejects_bad_values():
    p = bench.build_parser()
    with pytest.raises(SystemExit):
        p.parse_args(["--concurrency", "0"])
    with pytest.raises(SystemExit):
        p.parse_args(["--protocol", "udp"])
    with pytest.raises(SystemExit):  # an HTTP technique for a gRPC run
        bench.config_from_args(p.parse_args(["--client-impl", "http-gevent"]))
    with pytest.raises(SystemExit):
        bench.config_from_args(p.parse_args(["--client-processes", "0"]))
    with pytest.raises(SystemExit):
        bench.config_from_args(p.parse_args(["--dtype", "FP8"]))
    assert bench.config_from_args(p.parse_args(["--dtype", "int8"])).dtype == "INT8"
    assert bench.config_from_args(p.parse_args(["--dtype", "bytes"])).dtype == "BYTES"
    for bad in (["--percentile", "100"], ["--max-trials", "0"], ["-b", "0"],
                ["--input-data", "/nonexistent.json"]):
        with pytest.raises(SystemExit):
            bench.config_from_args(p.parse_args(bad))
    with pytest.raises(SystemExit):
        p.parse_args(["--request-rate", "0"])


# --- splitting work over client processes ---------------------------------------------


@pytest.mark.parametrize("c, n, expected", [
    (1, 1, [1]), (16, 1, [16]), (16, 2, [8, 8]), (10, 3, [4, 3, 3]), (2, 4, [1, 1]),
])
def test_split_concurrency(c, n, expected):
    assert bench.split_concurrency(c, n) == expected
    assert sum(expected) == c


@pytest.mark.parametrize("total, parts", [
    (100, [8, 8]), (10, [4, 3, 3]), (1, [1, 1]), (7, [5]),
])
def test_split_budget_adds_up(total, parts):
    shares = bench.split_budget(total, parts)
    assert sum(shares) == total
    assert all(s >= 0 for s in shares)


def test_split_budget_unbounded():
    assert bench.split_budget(None, [2, 2]) == [None, None]


# --- percentiles ------------------------------------------------------------------------


def test_percentile_matches_numpy():
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 10, 101, 1000):
        xs = list(rng.random(n))
        for q in (0, 1, 50, 90, 99, 99.9, 100):
            assert bench.percentile(xs, q) == pytest.approx(np.percentile(xs, q))


def test_percentile_small_cases():
    assert bench.percentile([5.0], 99) == 5.0
    assert bench.percentile([3.0, 1.0, 2.0], 50) == 2.0  # unsorted input
    assert bench.percentile([1.0, 2.0], 50) == 1.5
    assert bench.percentile([0, 10], 90) == pytest.approx(9.0)
    assert math.isnan(bench.percentile([], 50))
    with pytest.raises(ValueError):
        bench.percentile([1.0], 101)


# --- recorder (the measurement window) --------------------------------------------------


def test_recorder_window_and_budget():
    t0 = time.perf_counter()
    rec = bench.Recorder(t0 - 1.0, warmup=0.5, duration=60, max_requests=2)  # in window
    assert rec.next() and rec.next()
    assert not rec.next()  # budget spent
    rec.done(rec.start - 0.1, True)  # sent during warmup: not counted
    rec.done(time.perf_counter(), True)
    rec.done(time.perf_counter(), False)
    rec.error(RuntimeError("boom"))
    r = rec.result()
    assert len(r["latencies"]) == 2
    assert r["mismatches"] == 1 and r["errors"] == 1
    assert r["first_error"] == "RuntimeError: boom"
    assert r["seconds"] > 0


def test_recorder_stops_at_deadline():
    rec = bench.Recorder(time.perf_counter() - 10, warmup=1, duration=1, max_requests=None)
    assert not rec.next()
    assert rec.result()["seconds"] == pytest.approx(1.0)


# --- rows and tables --------------------------------------------------------------------


def _part(lat, seconds=1.0, errors=0, mismatches=0, cpu=0.5, first_error=""):
    return {"latencies": lat, "seconds": seconds, "errors": errors,
            "mismatches": mismatches, "cpu_s": cpu, "first_error": first_error}


def _row(**kw):
    parts = kw.pop("parts", [_part([0.001, 0.002, 0.003, 0.004])])
    args = dict(protocol="grpc", shape=[1, 16], dtype="FP32", concurrency=4, shm="none",
                impl="grpc-callback", model="identity_fp32", url="127.0.0.1:8001",
                server="triton")
    args.update(kw)
    return bench.summarize(parts, **args)


def test_summarize_merges_processes():
    row = _row(parts=[_part([0.001] * 30, seconds=2.0, cpu=0.6, errors=1,
                            first_error="E: x"),
                      _part([0.003] * 10, seconds=1.9, cpu=0.4, mismatches=2)])
    assert row.requests == 40
    assert row.seconds == 2.0
    assert row.throughput == pytest.approx(20.0)
    assert row.p50_ms == pytest.approx(1.0)
    assert row.p99_ms == pytest.approx(3.0)
    assert row.client_cpu == pytest.approx(0.5)  # (0.6 + 0.4) CPU s / 2 s
    assert row.errors == 1 and row.mismatches == 2 and row.first_error == "E: x"
    assert row.client_processes == 2


def test_table_formatting_aligns_columns():
    rows = [_row(), _row(protocol="http", shape=[1, 262144], concurrency=16, shm="system")]
    table = bench.format_table(rows).splitlines()
    assert len(table) == 3
    assert len({len(line) for line in table}) == 1  # fixed-width columns
    header = table[0].split()
    for col in ("proto", "shape", "conc", "requests", "infer/s", "errors"):
        assert col in header
    assert "[1,262144]" in table[2] and "system" in table[2] and " 16 " in table[2]
    fields = table[1].split()
    assert "4.0" in fields  # 4 requests in 1 s
    assert "2.500" in fields  # p50 of 1, 2, 3, 4 ms


def test_empty_point_formats_and_serializes():
    row = _row(parts=[_part([])])
    assert row.requests == 0 and math.isnan(row.p50_ms)
    assert " - " in bench.format_row(row) + " "
    d = bench.row_to_json(row)
    assert d["p50_ms"] is None
    json.dumps(d, allow_nan=False)
    assert bench.failed([row])  # nothing completed is a failure


def test_failed_reports_mismatches_and_errors():
    ok = _row()
    assert bench.failed([ok]) == []
    bad = _row(parts=[_part([0.001], mismatches=3)])
    assert "3 output mismatches" in bench.failed([bad])[0]
    err = _row(parts=[_part([0.001], errors=2, first_error="Boom")])
    assert "Boom" in bench.failed([err])[0]


def test_write_json(tmp_path):
    path = tmp_path / "out.json"
    bench.write_json(str(path), [_row()], {"argv": []})
    data = json.loads(path.read_text())
    assert data["rows"][0]["protocol"] == "grpc"
    assert data["rows"][0]["shape"] == [1, 16]


# --- compare's pure parts ---------------------------------------------------------------


def test_compare_points_and_ratio_table():
    points = compare.build_points(["http", "grpc"], [[1, 16]], ["none"], [1, 16])
    assert len(points) == 4
    rows = []
    for pt in points:
        for name, tput in (("triton", 100.0), ("shmserve", 150.0)):
            for rnd in (1, 2):
                rows.append({"server": name, "point": pt.key(), "round": rnd,
                             "throughput": tput + rnd, "p50_ms": 1.0, "p99_ms": 2.0,
                             "client_cpu": 0.5, "errors": 0, "mismatches": 0})
    summary = compare.summarize(rows, ["triton", "shmserve"], points)
    assert summary[0]["servers"]["triton"]["throughput"] == pytest.approx(101.5)
    assert summary[0]["ratio"]["shmserve"] == pytest.approx(151.5 / 101.5)
    lo, hi = summary[0]["ratio_range"]["shmserve"]
    assert lo == pytest.approx(152 / 102) and hi == pytest.approx(151 / 101)
    text = compare.format_summary(summary, ["triton", "shmserve"])
    assert "1.49" in text and "shmserve / triton" in text
    alone = compare.format_summary(compare.summarize(rows, ["triton"], points), ["triton"])
    assert "101.5" in alone and len(alone.splitlines()) == 2 + len(points)


def test_compare_server_specs():
    p = compare.build_parser()
    specs = compare.parse_servers(p.parse_args([]))
    assert [(s.name, s.http, s.grpc) for s in specs] == [
        ("triton", 18000, 18001), ("shmserve", 28000, 28001)]
    assert "run_triton_anchor" in specs[0].cmd and "--model-repository" in specs[1].cmd
    specs = compare.parse_servers(p.parse_args(
        ["--server", "a", "1", "2", "-", "--server", "b", "3", "4", "cmd x"]))
    assert [(s.name, s.port("http"), s.port("grpc"), s.cmd) for s in specs] == [
        ("a", 1, 2, "-"), ("b", 3, 4, "cmd x")]
    assert compare.parse_servers(p.parse_args(["--skip", "shmserve"]))[0].name == "triton"
    moved = compare.parse_servers(p.parse_args(["--triton-ports", "18100,18101",
                                                "--shmserve-ports", "28100,28101,28109"]))
    assert (moved[0].http, moved[0].grpc) == (18100, 18101)
    assert " 18100 18101 18102 " in moved[0].cmd  # metrics defaults to http + 2
    assert "--metrics-port 28109" in moved[1].cmd and "--grpc-port 28101" in moved[1].cmd
    assert compare.parse_servers(p.parse_args(["--triton", "-"]))[0].cmd == "-"
    with pytest.raises(ValueError):
        compare.parse_ports("1")


def test_steal_share():
    before = [100, 0, 50, 800, 0, 0, 10, 40]
    after = [150, 0, 70, 900, 0, 0, 10, 70]  # 200 ticks, 30 stolen
    assert bench.steal_share(before, after) == pytest.approx(0.15)
    assert math.isnan(bench.steal_share([], after))
    assert len(bench.cpu_times()) >= 8 or bench.cpu_times() == []


# --- a stream's tensors and verification (no server: the server's part is faked) -----


def _spec(**kw):
    args = dict(url="127.0.0.1:1", protocol="http", impl="http-gevent",
                model="identity_fp32", timeout=5.0,
                inputs=[{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16]}],
                outputs=[{"name": "OUTPUT0", "datatype": "FP32", "nbytes": -1}],
                streams=1, shm="none", verify=True, warmup=0, duration=1,
                max_requests=None, tag=f"test{os.getpid()}")
    args.update(kw)
    return bench.PointSpec(**args)


class _Result:
    def __init__(self, arr):
        self.arr = arr

    def as_numpy(self, name):
        return self.arr if not isinstance(self.arr, dict) else self.arr.get(name)


def test_stream_verifies_outputs():
    np = pytest.importorskip("numpy")
    httpclient = pytest.importorskip("tritonclient.http")
    s = bench.Stream(_spec(), 0, httpclient)
    s.prepare()
    assert s.check(_Result(s.expected.copy()))
    wrong = s.expected.copy()
    wrong.flat[3] += 1
    assert not s.check(_Result(wrong))
    assert not s.check(_Result(None))
    assert not s.check(_Result(s.expected.reshape(16)))  # wrong shape
    off = bench.Stream(_spec(verify=False), 0, httpclient)
    assert off.check(_Result(None))


def test_stream_sends_every_input_and_checks_every_output():
    """Two inputs, two outputs: output k is checked against input k; BYTES inputs
    are filled too."""
    np = pytest.importorskip("numpy")
    httpclient = pytest.importorskip("tritonclient.http")
    spec = _spec(inputs=[{"name": "A", "datatype": "INT32", "shape": [2, 3]},
                         {"name": "B", "datatype": "BYTES", "shape": [2]}],
                 outputs=[{"name": "X", "datatype": "INT32", "nbytes": 24},
                          {"name": "Y", "datatype": "BYTES", "nbytes": -1}])
    s = bench.Stream(spec, 1, httpclient)
    assert [x.name for x in s.inputs] == ["A", "B"]
    assert s.inputs[0].data.dtype == np.int32 and s.inputs[0].data.shape == (2, 3)
    assert s.inputs[1].data.dtype == object and all(
        isinstance(v, bytes) and len(v) == 16 for v in s.inputs[1].data)
    good = {"X": s.inputs[0].data.copy(), "Y": s.inputs[1].data.copy()}
    assert s.check(_Result(good))
    bad = dict(good, Y=np.array([b"a", b"b"], dtype=object))
    assert not s.check(_Result(bad))
    from scheduler import bench_client
    kw = bench_client._infer_kwargs(s)
    assert [i.name() for i in kw["inputs"]] == ["A", "B"]
    assert [o.name() for o in kw["outputs"]] == ["X", "Y"]


def test_stream_shm_regions_stamp_and_clean_up():
    np = pytest.importorskip("numpy")
    httpclient = pytest.importorskip("tritonclient.http")
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    s = bench.Stream(_spec(shm="system"), 3, httpclient)
    inp, out = s.inputs[0], s.outputs[0]
    s.create_regions()
    try:
        assert os.path.exists("/dev/shm/" + inp.region)
        assert os.path.exists("/dev/shm/" + out.region)
        s.prepare()
        assert np.array_equal(inp.view, s.expected)
        assert not s.check(None)  # the "server" wrote nothing: stale output
        out.view[...] = inp.view  # what an identity model does
        assert s.check(None)
        s.prepare()  # a new stamp: last request's output no longer matches
        assert not s.check(None)
    finally:
        s.destroy_regions()
    assert not os.path.exists("/dev/shm/" + inp.region)
    assert not os.path.exists("/dev/shm/" + out.region)


# --- scripts/bench_scheduler.py -----------------------------------------------------------


def test_bench_scheduler_runs_every_request_through_batches_of_the_burst():
    import argparse

    import bench_scheduler
    args = argparse.Namespace(requests=640, burst=16, max_batch=8, instances=2, delay_us=0,
                              no_histograms=False)
    out = bench_scheduler.run(args)
    # two idle instances and 16 requests a burst: every batch is a full 8
    assert out["batch_sizes"] == {8: 80}
    assert out["requests"] == 640 and out["requests_per_s"] > 0
