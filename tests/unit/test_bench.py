"""The pure parts of scripts/bench.py and scripts/compare.py: no server needed."""

import importlib.util
import json
import math
import os
import sys
import tempfile
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
    # CPU per request by role: meaned over rounds, the server's total in the ratio table
    for row in rows:
        row["cpu_us"] = ({"tritonserver": 60.0 + row["round"], "server": 60.0 + row["round"]}
                         if row["server"] == "triton" else
                         {"frontend": 100.0, "scheduler": 20.0, "server": 120.0})
    summary = compare.summarize(rows, ["triton", "shmserve"], points)
    assert summary[0]["servers"]["triton"]["cpu_us"]["server"] == pytest.approx(61.5)
    text = compare.format_summary(summary, ["triton", "shmserve"])
    assert "62 / 120" in text  # server us/req, baseline / other (61.5 rounds to 62)
    assert "shmserve: frontend 100.0 | scheduler 20.0 | server 120.0" in text


def test_compare_cuda_regions_and_the_triton_launcher(tmp_path, monkeypatch):
    """--shm cuda is a point like the others; an exited server gives a row with one
    error; $TRITON_CMD (the GPU machine's launcher) replaces the anchor's."""
    args = compare.build_parser().parse_args(["--shm", "none,cuda", "--cuda-device", "1"])
    assert args.cuda_device == 1 and "cuda" in compare.SHMS
    with pytest.raises(SystemExit, match="unknown --shm"):
        compare.main(["--server", "x", "1", "2", "-", "--shm", "gpu"])
    pt = compare.Point("grpc", (1 << 22,), "cuda", 4)
    server = compare.Server(compare.ServerSpec("shmserve", "true", 1, 2), str(tmp_path),
                            1.0, 1.0, "m")
    server.exited = lambda: True
    row = compare.measure_row(None, server, pt, 2, model="m", duration=1.0, warmup=0.0,
                              verify=False, cuda_device=1, input_name="INPUT__0")
    assert (row["errors"], row["requests"], row["round"], row["point"]) == \
        (1, 0, 2, pt.key())
    assert row["shm"] == "cuda" and row["server"] == "shmserve"
    assert row["first_error"].startswith("server exited")
    # compare reads $TRITON_CMD once, at import: a second copy of the module, run with
    # it set, reads it as a fresh process would (a child that imports compare again
    # cost ~0.25 s of CPU). It lives under its own name while it runs (dataclasses look
    # their module up); both that and its sys.path entry are undone after.
    monkeypatch.setenv("TRITON_CMD", "/x/run_triton")
    monkeypatch.setattr(sys, "path", list(sys.path))
    spec = importlib.util.spec_from_file_location("compare_with_triton_cmd",
                                                  compare.__file__)
    fresh = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, fresh)
    spec.loader.exec_module(fresh)
    assert fresh.TRITON_CMD.startswith("/x/run_triton {repo} {http} {grpc} {metrics}")


def test_compare_server_specs():
    p = compare.build_parser()
    specs = compare.parse_servers(p.parse_args([]))
    assert [(s.name, s.http, s.grpc) for s in specs] == [
        ("triton", 18000, 18001), ("shmserve", 28000, 28001)]
    assert specs[0].cmd.startswith(compare.TRITON_LAUNCHER + " ")
    assert "--model-repository" in specs[1].cmd
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
    from scheduler.bench import client as bench_client
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


# --- scripts/bench_frontend.py ----------------------------------------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bench_frontend_answers_every_request_of_every_wave(protocol):
    import argparse
    import asyncio

    import bench_frontend
    args = argparse.Namespace(protocol=protocol, requests=320, connections=4, streams=4,
                              segments=2)
    out = asyncio.run(bench_frontend.run(args, None))
    # every wave answered (HTTP: 80 waves of 4; gRPC: 20 waves of 4 x 4 streams), and
    # the last one checked: each answer a 200 or a DATA frame with the input back, and
    # the trailers that end its stream (gRPC)
    assert out["requests"] == 320 and out["min_us"] > 0
    body = bench_frontend.request_bytes(16)
    assert body.startswith(b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\n")
    # --instructions divides by the requests between its two runs: warm-up included
    args.connections = 64 if protocol == "http" else 16
    assert bench_frontend.served(640, args) == 11 * 64
    assert bench_frontend.served(2560, args) == 44 * 64


def test_bench_frontend_check_refuses_a_wrong_answer():
    """The checks see the answers: a stand-in that sends other bytes back fails them."""
    import asyncio

    import bench_frontend
    from shm.messages.results import InferResponse
    from shm.tensor import TensorRef

    class Wrong(bench_frontend.GrpcBench):
        def answer(self, msg):  # zeros of the input's length, not the input
            out = [TensorRef("OUTPUT0", ref.datatype, ref.shape, data=bytes(len(ref.data)))
                   for ref in msg.inputs]
            self.answers.send(msg.reply_to, InferResponse(msg.id, outputs=out))

    async def main():
        with tempfile.TemporaryDirectory() as folder:
            bench = Wrong(folder, 2, 16, 2)
            bench.attach(asyncio.get_running_loop())
            try:
                await bench.wave()
                with pytest.raises(SystemExit, match="the frontend answered"):
                    bench.check()
            finally:
                bench.close()

    asyncio.run(main())


# --- placement: scripts/benchkit.py and scripts/compare.py ------------------------------


def test_server_and_client_cpus(monkeypatch):
    """--server-cpus places every server a benchkit script starts; --client-cpus the
    script itself (its load tools inherit it), leaving the servers on every CPU."""
    import argparse

    import benchkit
    placed = []
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: placed.append(set(cpus)))
    monkeypatch.setattr(benchkit, "SERVER_CPUS", None)
    everywhere = os.sched_getaffinity(0)
    cpu = min(everywhere)
    benchkit.place(argparse.Namespace(server_cpus=str(cpu), client_cpus=None))
    assert benchkit.SERVER_CPUS == {cpu} and placed == []
    benchkit.place(argparse.Namespace(server_cpus=None, client_cpus=str(cpu)))
    assert benchkit.SERVER_CPUS == everywhere and placed == [{cpu}]
    with pytest.raises(SystemExit, match="not available"):
        compare.parse_cpus(str(max(everywhere) + 1))


def test_shmserve_args_reach_every_shmserve_command(monkeypatch):
    import benchkit
    p = benchkit.parser("doc")
    benchkit.add_common_args(p, [1, 2, 3])
    monkeypatch.setattr(sys, "argv", ["x", "--shmserve-args", "--frontend-processes 2"])
    monkeypatch.setattr(benchkit, "SHMSERVE_ARGS", [])
    benchkit.parse(p, "test-")
    assert benchkit.SHMSERVE_ARGS == ["--frontend-processes", "2"]


def test_wake_cost_measures_a_round_trip():
    import wake_cost
    cpu = min(os.sched_getaffinity(0))
    wall, parent, child = wake_cost.ping_pong(200, (cpu, cpu))
    assert wall > 0 and parent > 0 and child >= 0
    assert os.sched_getaffinity(0) != {cpu} or len(os.sched_getaffinity(0)) == 1


# --- inputs from the model's metadata ----------------------------------------------------

from scheduler.bench import inputs as bench_inputs  # noqa: E402
from scheduler.bench import open_loop as bench_open  # noqa: E402
from scheduler.bench import procs as bench_procs  # noqa: E402
from scheduler.bench import report as bench_report  # noqa: E402

ADD_SUB_META = {"name": "add_sub", "inputs": [
    {"name": "INPUT0", "datatype": "FP32", "shape": [16]},
    {"name": "INPUT1", "datatype": "FP32", "shape": [16]}], "outputs": [
    {"name": "OUTPUT0", "datatype": "FP32", "shape": [16]},
    {"name": "OUTPUT1", "datatype": "FP32", "shape": [16]}]}
# as gRPC's JSON writes it: int64 dims as strings
IDENTITY_META = {"name": "identity_fp32",
                 "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "-1"]}],
                 "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": ["-1", "-1"]}]}


@pytest.mark.parametrize("text, expected", [
    ("1,16", (None, [1, 16])), ("INPUT0:16", ("INPUT0", [16])),
    ("a:b:2x3", ("a:b", [2, 3])), ("IN:[4, 5]", ("IN", [4, 5])),
])
def test_parse_named_shape(text, expected):
    assert bench_inputs.parse_named_shape(text) == expected


@pytest.mark.parametrize("text", [":16", "X:", "X:0", "X:a"])
def test_parse_named_shape_rejects(text):
    with pytest.raises(ValueError):
        bench_inputs.parse_named_shape(text)


def test_cli_named_shapes_and_batch():
    p = bench.build_parser()
    cfg = bench.config_from_args(p.parse_args(
        ["--shape", "INPUT0:32", "-b", "4", "--input-data", "zero"]))
    assert cfg.named_shapes == {"INPUT0": [32]} and cfg.shapes == []
    assert cfg.batch_size == 4 and cfg.input_data == "zero"
    cfg = bench.config_from_args(p.parse_args(["--request-rate", "100,250.5",
                                               "--percentile", "95"]))
    assert cfg.loads() == [(64, 100.0), (64, 250.5)] and cfg.max_trials == 10
    assert cfg.client_impl() == "grpc-aio" and cfg.percentile == 95


def test_workload_reads_every_input_and_output():
    w = bench_inputs.workload_from_metadata(ADD_SUB_META, 0)
    assert [(t.name, t.datatype, t.shape) for t in w.inputs] == [
        ("INPUT0", "FP32", [16]), ("INPUT1", "FP32", [16])]
    assert [(o.name, o.nbytes) for o in w.outputs] == [("OUTPUT0", 64), ("OUTPUT1", 64)]
    assert w.notes == [] and w.label() == "INPUT0:[16] INPUT1:[16]"
    w = bench_inputs.workload_from_metadata(ADD_SUB_META, 0, output_names=["OUTPUT1"])
    assert [o.name for o in w.outputs] == ["OUTPUT1"]


def test_workload_batch_dim_and_variable_dims():
    # the batch dim comes from -b; variable dims default, with a note saying so
    w = bench_inputs.workload_from_metadata(IDENTITY_META, 64, batch_size=4)
    assert w.inputs[0].shape == [4, bench_inputs.DEFAULT_VARIABLE_DIM]
    assert w.outputs[0].nbytes == -1 and "INPUT0" in w.notes[0]
    w = bench_inputs.workload_from_metadata(IDENTITY_META, 64, 2, {"INPUT0": [100]})
    assert w.inputs[0].shape == [2, 100] and w.notes == []
    # an unnamed shape is the whole request shape, as the bench always took it
    w = bench_inputs.workload_from_metadata(IDENTITY_META, 64, whole=[1, 262144])
    assert w.inputs[0].shape == [1, 262144]


@pytest.mark.parametrize("kw", [
    {"named": {"NOPE": [1]}},                      # not an input
    {"named": {"INPUT0": [4, 4]}},                 # wrong rank
    {"batch_size": 65},                            # above max_batch_size
])
def test_workload_rejects(kw):
    with pytest.raises(ValueError):
        bench_inputs.workload_from_metadata(IDENTITY_META, 64, **kw)


def test_workload_rejects_fixed_dim_mismatch_and_batch_without_batching():
    with pytest.raises(ValueError):
        bench_inputs.workload_from_metadata(ADD_SUB_META, 0, named={"INPUT0": [8]})
    with pytest.raises(ValueError):
        bench_inputs.workload_from_metadata(ADD_SUB_META, 0, batch_size=2)


def test_input_data_file_formats(tmp_path):
    """perf_analyzer's JSON input data: flat lists, content+shape objects, b64, BYTES."""
    np = pytest.importorskip("numpy")
    import base64
    specs = [bench_inputs.TensorSpec("A", "INT32", [2, 2]),
             bench_inputs.TensorSpec("S", "BYTES", [1])]
    raw = np.arange(4, dtype=np.int32).tobytes()
    doc = {"data": [
        {"A": [1, 2, 3, 4], "S": ["hi"]},
        {"A": {"content": [5, 6, 7, 8, 9, 10], "shape": [3, 2]}, "S": {"content": ["x"]}},
        {"A": {"b64": base64.b64encode(raw).decode()}, "S": {"b64": "eXo="}},
    ]}
    path = tmp_path / "data.json"
    path.write_text(json.dumps(doc))
    entries = bench_inputs.load_input_data(str(path), specs)
    assert len(entries) == 3
    assert entries[0]["A"].dtype == np.int32 and entries[0]["A"].tolist() == [[1, 2], [3, 4]]
    assert entries[0]["S"].tolist() == [b"hi"]
    assert entries[1]["A"].shape == (3, 2)
    assert entries[2]["A"].tolist() == [[0, 1], [2, 3]] and entries[2]["S"].tolist() == [b"yz"]
    # each stream takes one entry in turn; a copy, so stamping one leaves the others
    a = bench_inputs.make_arrays(specs, "random", 4, entries)
    assert a["A"].tolist() == [[5, 6], [7, 8], [9, 10]]
    a["A"][0, 0] = 99
    assert entries[1]["A"][0, 0] == 5


@pytest.mark.parametrize("doc", [
    [], {"data": []}, {"data": [{"B": [1]}]}, {"data": [{"A": [1, 2, 3]}]},
    {"data": [{"A": {"shape": [4]}}]}, {"data": ["x"]},
])
def test_input_data_rejects(doc):
    pytest.importorskip("numpy")
    with pytest.raises(ValueError):
        bench_inputs.parse_input_data(doc, [bench_inputs.TensorSpec("A", "FP32", [4])])


def test_make_arrays_zero_and_random():
    np = pytest.importorskip("numpy")
    specs = [bench_inputs.TensorSpec("F", "FP16", [2, 3]),
             bench_inputs.TensorSpec("B", "BOOL", [4]),
             bench_inputs.TensorSpec("S", "BYTES", [3])]
    z = bench_inputs.make_arrays(specs, "zero", 0)
    assert z["F"].dtype == np.float16 and not z["F"].any() and not z["B"].any()
    assert z["S"].shape == (3,)
    r1, r2 = (bench_inputs.make_arrays(specs, "random", 7) for _ in range(2))
    assert np.array_equal(r1["F"], r2["F"])  # seeded per stream
    assert not np.array_equal(r1["F"], bench_inputs.make_arrays(specs, "random", 8)["F"])


# --- the open loop ------------------------------------------------------------------------


def test_send_times_constant_and_poisson():
    t = bench_open.send_times(100, "constant", 10.0, 11.0)
    assert len(t) == 100 and t[0] == 10.0 and t[1] == pytest.approx(10.01)
    shifted = bench_open.send_times(100, "constant", 10.0, 11.0, phase=0.005)
    assert shifted[0] == pytest.approx(10.005)
    p1 = bench_open.send_times(1000, "poisson", 0.0, 20.0, seed=3)
    assert p1 == bench_open.send_times(1000, "poisson", 0.0, 20.0, seed=3)
    assert len(p1) == pytest.approx(20000, rel=0.05)
    assert all(b > a for a, b in zip(p1, p1[1:]))
    with pytest.raises(ValueError):
        bench_open.send_times(0, "constant", 0, 1)
    with pytest.raises(ValueError):
        bench_open.send_times(1, "gamma", 0, 1)


def test_pacer_with_a_controlled_clock():
    """Sends due on a 10 ms grid; the client is late for some and never sends the
    last ones of the window: late and unsent count only inside the window."""
    times = bench_open.send_times(100, "constant", 0.0, 0.1)  # 0, 0.01, ... 0.09
    pacer = bench_open.Pacer(times, window_start=0.02, window_end=0.1)
    assert pacer.wait(0.0) == 0
    assert pacer.take(0.0) == 0.0
    assert pacer.wait(0.0) == pytest.approx(0.01)  # wait for the next one
    assert pacer.take(0.05) == pytest.approx(0.01)  # 40 ms late, but before the window
    assert pacer.late == 0
    assert pacer.take(0.05) == pytest.approx(0.02)  # in the window and late
    assert pacer.take(0.0305) == pytest.approx(0.03)  # 0.5 ms: on time
    assert pacer.late == 1
    assert pacer.unsent() == 6  # 0.04 .. 0.09 not sent yet
    for now in (0.04, 0.05, 0.06):
        pacer.take(now)
    assert pacer.unsent() == 3 and pacer.late == 1
    while pacer.wait(1.0) is not None:
        pacer.take(1.0)
    assert pacer.late == 4 and pacer.unsent() == 0


def test_open_loop_runs_on_schedule():
    """run_open_loop against a fake server that answers after 20 ms: at 200/s with
    two slots the loop falls behind, and says so (late sends); the window's requests
    are all answered and counted."""
    import asyncio

    class _S:
        def prepare(self):
            pass

        def check(self, result):
            return result == "ok"

    async def infer(stream):
        await asyncio.sleep(0.02)
        return "ok"

    t0 = time.perf_counter()
    rec = bench.Recorder(t0, 0.05, 0.2, None, drain=True)
    times = bench_open.send_times(200, "constant", t0, rec.deadline)
    asyncio.run(bench_open.run_open_loop([_S(), _S()], infer, rec, times))
    assert rec.errors == 0 and rec.mismatches == 0
    assert rec.late > 0  # two slots, 20 ms each: at most 100/s
    sent = rec.issued
    assert sent + rec.unsent == 40 and len(rec.latencies) == sent
    assert min(rec.latencies) >= 0.019


# --- stability, merging, the server's split -----------------------------------------------


def _with(row, **fields):
    for k, v in fields.items():
        setattr(row, k, v)
    return row


def test_stability_rule():
    s = bench_report.is_stable
    assert not s([(100, 1.0), (100, 1.0)], 10)  # fewer than three windows
    assert s([(50, 9), (100, 1.0), (105, 1.05), (109, 1.09)], 10)
    assert not s([(100, 1.0), (105, 1.05), (111, 1.0)], 10)  # throughput 11% apart
    assert not s([(100, 1.0), (100, 1.2), (100, 1.0)], 10)  # latency 20% apart
    assert s([(100, 1.0), (100, 1.2), (100, 1.0)], 25)
    assert not s([(100, math.nan), (100, 1.0), (100, 1.0)], 10)


def test_merge_trials_averages_and_weights():
    a = _with(_row(), throughput=100.0, requests=100, p50_ms=1.0, seconds=1.0)
    b = _with(_row(), throughput=200.0, requests=300, p50_ms=3.0, seconds=1.0)
    a.cpu_us, b.cpu_us = {"scheduler": 10.0, "client": 50.0}, {"scheduler": 20.0,
                                                             "client": 30.0}
    a.server_stats = {"requests": 100, "queue_us": 4.0}
    b.server_stats = {"requests": 300, "queue_us": 8.0}
    m = bench.merge_trials([a, b], True, 5)
    assert m.throughput == 150.0 and m.p50_ms == 2.0 and m.requests == 400
    assert m.cpu_us == {"scheduler": 17.5, "client": 35.0}
    assert m.server_stats == {"requests": 400, "queue_us": 7.0}
    assert m.trials == 5 and m.stable is True


def test_server_split_from_stats():
    grpc_doc = {"model_stats": [{"inference_stats": {
        "success": {"count": "10", "ns": "5000000"}, "queue": {"count": "10",
                                                              "ns": "1000000"},
        "compute_input": {}, "compute_infer": {"count": "10", "ns": "3000000"},
        "compute_output": {"count": "10", "ns": "200000"}}}]}
    before = bench_report.stats_from_json({"model_stats": [{"inference_stats": {}}]})
    after = bench_report.stats_from_json(grpc_doc)
    split = bench_report.server_split(before, after)
    assert split == {"requests": 10, "queue_us": 100.0, "compute_input_us": 0.0,
                     "compute_infer_us": 300.0, "compute_output_us": 20.0}
    assert "queue 100.0 us" in bench_report.server_line(split)
    assert bench_report.server_split(None, after) == {}
    assert bench_report.stats_from_json({"error": "x"}) is None


def test_csv_has_perf_analyzer_columns_and_a_column_per_role(tmp_path):
    import csv
    a = _row(concurrency=4)
    a.cpu_us = {"frontend": 100.0, "scheduler": 50.0, "client": 80.0}
    a.server_stats = {"requests": 10, "queue_us": 12.5, "compute_input_us": 1.0,
                      "compute_infer_us": 40.0, "compute_output_us": 2.0}
    b = _row(concurrency=8)
    b.cpu_us = {"client": 70.0}
    path = tmp_path / "out.csv"
    bench_report.write_csv(str(path), [bench.row_to_json(a), bench.row_to_json(b)])
    lines = list(csv.DictReader(path.open()))
    assert len(lines) == 2
    assert lines[0]["Concurrency"] == "4" and lines[0]["Server Queue"] == "12.5"
    assert float(lines[0]["p50 latency"]) == pytest.approx(a.p50_ms * 1e3)
    assert lines[0]["cpu us/req frontend"] == "100.0"
    assert lines[1]["cpu us/req frontend"] == "" and lines[1]["cpu us/req client"] == "70.0"


def test_plot_draws_several_runs(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    run = tmp_path / "run.json"
    rows = [_row(), _with(_row(), throughput=300.0)]
    bench.write_json(str(run), rows, {"label": "earlier"})
    now = [bench.row_to_json(_row())]
    # what plot_files hands the drawing: the extra run first, then each file's rows
    # under its label (one drawing is enough for the PNG: ~0.25 s of CPU each)
    drawn = []
    with monkeypatch.context() as m:
        m.setattr(bench_report, "plot", lambda path, runs: drawn.append((path, runs)))
        bench_report.plot_files("x.png", [str(run), str(run)], extra=[("now", now)])
    ((path, runs),) = drawn
    assert path == "x.png"
    assert [label for label, _ in runs] == ["now", "earlier", "earlier (run)"]
    assert runs[0][1] == now
    assert runs[1][1] == runs[2][1] == [bench.row_to_json(r) for r in rows]
    out = tmp_path / "p2.png"
    assert bench.main(["plot", str(out), str(run), str(run)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- process roles and profiles --------------------------------------------------------


def test_roles_from_command_lines():
    py = ["/venv/bin/python", "-m"]
    sched = py + ["scheduler.main", "--model-repository", "x"]
    assert bench_procs.role_of(sched, ["bash"]) == "root"
    assert bench_procs.role_of(sched, sched) == "scheduler"
    assert bench_procs.role_of(py + ["frontend.main", "--index", "1"]) == "frontend 1"
    assert bench_procs.role_of(py + ["workers.main", "--name", "add_sub/1/add_sub_0_0#3"]) \
        == "worker add_sub/1/add_sub_0_0"
    assert bench_procs.role_of(["/opt/tritonserver/bin/tritonserver"]) == "tritonserver"
    assert bench_procs.role_of(["/x/triton_python_backend_stub", "m"]) == "python_stub"
    assert bench_procs.role_of(["bash", "-c", "run"]) is None


def test_group_roles_sums_frontends_and_other_models_workers():
    cpu = {"frontend 0": 1.0, "frontend 1": 2.0, "scheduler": 0.5, "root": 0.0,
           "worker add_sub/1/add_sub_0_0": 0.7, "worker identity/1/identity_0": 0.1,
           "worker cpu worker": 0.2}
    g = bench_procs.group_roles(cpu, "add_sub")
    assert g["frontend"] == 3.0 and g["frontend 0"] == 1.0 and g["frontend 1"] == 2.0
    assert g["worker add_sub/1/add_sub_0_0"] == 0.7 and g["worker cpu worker"] == 0.2
    assert g["other workers"] == 0.1 and "worker identity/1/identity_0" not in g
    assert list(g)[:3] == ["frontend", "frontend 0", "frontend 1"]


def test_role_sampler_reads_this_process_tree():
    """This test process stands in for a server: its CPU time is read from /proc."""
    if not os.path.exists(f"/proc/{os.getpid()}/stat"):
        pytest.skip("no /proc")
    sampler = bench_procs.RoleSampler(os.getpid())
    before = sampler.sample()
    t = time.process_time()
    while time.process_time() - t < 0.05:
        pass
    after = sampler.sample()
    cpu = sampler.per_role(before, after)
    assert sum(cpu.values()) > 0.0


def test_collapsed_stacks_top_functions():
    text = ("main (a.py:1);loop (a.py:5);decode (b.py:9) 6\n"
            "main (a.py:1);loop (a.py:5) 3\nmain (a.py:1);send (c.py:2) 1\n")
    own, incl, total = bench_procs.collapsed_top(text)
    assert total == 10 and own["decode (b.py:9)"] == 6 and own["loop (a.py:5)"] == 3
    assert incl["loop (a.py:5)"] == 9 and incl["main (a.py:1)"] == 10
    top = bench_procs.format_top("frontend 0", 42, own, incl, total, n=2)
    assert "decode (b.py:9)" in top and "send" not in top and "60.0%" in top


def test_stream_bytes_inputs_go_into_regions_serialized():
    """A BYTES input's region holds Triton's serialized form (length-prefixed)."""
    np = pytest.importorskip("numpy")
    httpclient = pytest.importorskip("tritonclient.http")
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    spec = _spec(shm="system", verify=False,
                 inputs=[{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1]}],
                 outputs=[{"name": "UPPER", "datatype": "BYTES", "nbytes": -1}])
    s = bench.Stream(spec, 0, httpclient)
    x = s.inputs[0]
    assert x.nbytes == 4 + bench_inputs.STRING_LENGTH
    s.create_regions()
    try:
        with open("/dev/shm/" + x.region, "rb") as f:
            raw = f.read()
        assert int.from_bytes(raw[:4], "little") == bench_inputs.STRING_LENGTH
        assert raw[4:x.nbytes] == x.data.flat[0]
        assert s.outputs[0].nbytes == spec.output_shm_size  # unknown: the default size
    finally:
        s.destroy_regions()


def test_unknown_server_pid_is_said_not_zeroed():
    """A remote server: no CPU by role, a note saying why, the client's own figure."""
    cfg = bench.config_from_args(bench.build_parser().parse_args(
        ["--url", "10.1.2.3:8001"]))
    pid, note = bench.find_server_pid(cfg)
    assert pid is None and "not local" in note
    probe = bench.ServerProbe(cfg, pid, note)
    probe.last = {"server_stats": {}, "cpu_s": None, "profile": ""}
    row = _row()
    probe.fill(row)
    assert set(row.cpu_us) == {"client"} and row.cpu_note == note
    assert "not local" in bench_report.cpu_line(row.cpu_us, row.cpu_note)
    cfg.server_pid = 4242
    assert bench.find_server_pid(cfg) == (4242, "")


def test_listening_port_leads_to_this_process():
    """find_server: the process holding a listening socket on the port, climbed to
    the top of its server (here: this test process, not a server)."""
    import socket
    if not os.path.exists("/proc/net/tcp"):
        pytest.skip("no /proc/net/tcp")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert os.getpid() in bench_procs.listening_pids(port)
        assert bench_procs.find_server(port) == os.getpid()


def test_callgrind_count_divides_the_difference_of_two_runs(monkeypatch):
    """--instructions: (instructions of the large run - the small run's) over the
    units of work between them, the start-up both share left out."""
    import subprocess

    import callgrind_count

    runs = []

    def fake_run(cmd, **kwargs):
        n = int(cmd[-1])
        runs.append(cmd)
        # a start-up of 10M instructions, then 1,000 a unit of 2 requests each
        collected = 10_000_000 + 1_000 * n
        return subprocess.CompletedProcess(cmd, 0, "", f"==1== Collected : {collected}\n")

    monkeypatch.setattr(callgrind_count.shutil, "which", lambda name: "/usr/bin/valgrind")
    monkeypatch.setattr(callgrind_count.subprocess, "run", fake_run)
    got = callgrind_count.per_unit(lambda n: ["bench.py", "--n", str(n)], 100, 400,
                                   lambda n: 2 * n)
    assert got == 500.0
    assert [r[0] for r in runs] == ["valgrind", "valgrind"]
    assert runs[0][-1] == "100" and runs[1][-1] == "400"
    line = callgrind_count.median_line([3.0e5, 1.0e5, 2.0e5], "request")
    assert line == ("200,000 instructions per request (median; rounds: 100,000, 200,000, "
                    "300,000)")
