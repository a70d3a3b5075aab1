"""shmserve-bench's perf_analyzer flags (scheduler/bench/pa_flags.py): every flag of
the table parses to its meaning or is refused by name with its reason; the -f CSV has
perf_analyzer's layout; sequences get their flags and ids; the streaming figures are
summarized. No server: the e2e runs are in tests/e2e/test_bench_pa.py."""

import csv
import math
from pathlib import Path

import pytest

from scheduler.bench import main as bench
from scheduler.bench.client import Recorder
from scheduler.bench.pa_flags import (
    FLAGS, NO_EFFECT, REFUSED, SAME, check_refused, expand_range, markdown_table,
    parse_id_range, parse_request_parameter,
)
from scheduler.bench.report import pa_csv_lines, write_pa_csv
from scheduler.bench.sequences import SequenceDriver

README = Path(__file__).resolve().parents[2] / "README.md"


def parse(*argv):
    """(args, config) as main() makes them, without a server."""
    check_refused(list(argv))
    args = bench.build_parser().parse_args(list(argv))
    return args, bench.config_from_args(args)


def _data_file(tmp_path):
    path = tmp_path / "data.json"
    path.write_text('{"data": [{"INPUT0": [1, 2]}]}')
    return str(path)


# flag (its table name) -> (argv, check of (args, cfg)); every taken flag has one
EXAMPLES = {
    "-m": (["-m", "resnet"], lambda a, c: c.model == "resnet"),
    "-x": (["-x", "2"], lambda a, c: c.model_version == "2"),
    "--service-kind": (["--service-kind=triton"], lambda a, c: a.service_kind == "triton"),
    "-v": (["-v", "-v"], lambda a, c: c.verbose == 2),
    "--measurement-mode": (["--measurement-mode", "time_windows"],
                           lambda a, c: a.measurement_mode == "time_windows"),
    "--measurement-interval": (["-p", "1500"], lambda a, c: c.duration == 1.5),
    "--stability-percentage": (["-s", "5"], lambda a, c: c.stability_percentage == 5),
    "--percentile": (["--percentile=95"],
                     lambda a, c: c.percentile == 95 and c.max_trials == 10),
    "--max-trials": (["-r", "4"], lambda a, c: c.max_trials == 4),
    "--concurrency-range": (["--concurrency-range", "1:16:4"],
                            lambda a, c: c.concurrency == [1, 5, 9, 13]),
    "--request-rate-range": (["--request-rate-range=100:300:100"],
                             lambda a, c: c.request_rates == [100.0, 200.0, 300.0]),
    "--request-distribution": (["--request-rate-range", "50", "--request-distribution",
                                "poisson"], lambda a, c: c.distribution == "poisson"),
    "--latency-threshold": (["-l", "50"], lambda a, c: c.latency_threshold_ms == 50),
    "--max-threads": (["--max-threads", "8"], lambda a, c: c.impl is None),
    "--request-parameter": (["--request-parameter", "max_tokens:256:int"],
                            lambda a, c: c.parameters == {"max_tokens": 256}),
    "--sequence-length": (["--sequence-length", "5"], lambda a, c: c.sequence_length == 5),
    "--sequence-length-variation": (["--sequence-length-variation=0"],
                                    lambda a, c: c.sequence_variation == 0),
    "--sequence-id-range": (["--sequence-id-range", "10:20"],
                            lambda a, c: c.sequence_ids == (10, 20)),
    "--serial-sequences": (["--serial-sequences"], lambda a, c: True),
    "--input-data": (["--input-data", "zero"], lambda a, c: c.input_data == "zero"),
    "-z": (["-z"], lambda a, c: c.input_data == "zero"),
    "-b": (["-b", "4"], lambda a, c: c.batch_size == 4),
    "--shape": (["--shape", "IN:4,4"], lambda a, c: c.named_shapes == {"IN": [4, 4]}),
    "--string-length": (["--string-length", "7"], lambda a, c: c.string_length == 7),
    "--string-data": (["--string-data", "abc"], lambda a, c: c.string_data == "abc"),
    "--shared-memory": (["--shared-memory=system"], lambda a, c: c.shm == "system"),
    "--output-shared-memory-size": (["--output-shared-memory-size", "4096"],
                                    lambda a, c: c.output_shm_size == 4096),
    "--input-tensor-format": (["--input-tensor-format", "binary"], lambda a, c: True),
    "--output-tensor-format": (["--output-tensor-format=binary"], lambda a, c: True),
    "-i": (["-i", "http"], lambda a, c: c.protocol == "http"
           and c.url == "127.0.0.1:8000"),
    "--async": (["-i", "http", "-a"], lambda a, c: c.client_impl() == "http-aio"),
    "--sync": (["--sync"], lambda a, c: c.client_impl() == "grpc-threads"),
    "--streaming": (["--streaming"], lambda a, c: c.client_impl() == "grpc-stream"),
    "-H": (["-i", "http", "-H", "X-Trace: on"],
           lambda a, c: c.headers == {"X-Trace": "on"}),
    "--grpc-compression-algorithm": (["--grpc-compression-algorithm", "gzip"],
                                     lambda a, c: c.compression == "gzip"),
    "-u": (["-u", "10.0.0.1:9001"], lambda a, c: c.url == "10.0.0.1:9001"),
    "-f": (["-f", "out.csv"], lambda a, c: a.pa_csv == "out.csv"),
    "--verbose-csv": (["--verbose-csv"], lambda a, c: a.verbose_csv),
    "-t": (["-t", "3"], lambda a, c: c.concurrency == [3]),
}


def test_every_taken_flag_has_an_example():
    """Rule: the table is the one source; a flag added to it without a test fails."""
    taken = {f.name for f in FLAGS if f.status in (SAME, NO_EFFECT)}
    assert taken == set(EXAMPLES)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_taken_flag_has_its_meaning(name):
    argv, check = EXAMPLES[name]
    args, cfg = parse(*argv)
    assert check(args, cfg), (argv, cfg)


def test_every_spelling_of_a_taken_flag_parses():
    """Short and long spellings alike (perf_analyzer's -p and --measurement-interval)."""
    assert parse("--measurement-interval", "250")[1].duration == 0.25
    assert parse("--stability-percentage", "7")[1].stability_percentage == 7
    assert parse("--max-trials=3")[1].max_trials == 3
    assert parse("--latency-threshold", "9")[1].latency_threshold_ms == 9
    assert parse("--async")[1].client_impl() == "grpc-callback"
    assert parse("-i", "http", "--sync")[1].client_impl() == "http-gevent"


def test_shmserve_spellings_still_work(tmp_path):
    args, cfg = parse("--url", "h:1", "--protocol", "http", "--model", "m",
                      "--concurrency", "1,4", "--duration", "2", "--shm", "system",
                      "--output-shm-size", "64", "--input-data", _data_file(tmp_path))
    assert (cfg.url, cfg.protocol, cfg.model, cfg.concurrency, cfg.duration, cfg.shm,
            cfg.output_shm_size) == ("h:1", "http", "m", [1, 4], 2.0, "system", 64)


@pytest.mark.parametrize("flag", [f for f in FLAGS if f.status == REFUSED],
                         ids=lambda f: f.name)
def test_refused_flag_named_with_reason(flag, capsys):
    """Rule: a flag perf_analyzer has and the bench does not is refused by name, with
    the table's reason, before argparse could call it a typo."""
    argv = ["-m", "x", flag.spellings[0]] + (["1"] if flag.value else [])
    with pytest.raises(SystemExit) as e:
        bench.main(argv)
    text = str(e.value.code)
    assert f"perf_analyzer's {flag.spellings[0]} is not supported" in text
    assert flag.note in text
    assert flag.note  # a refusal always says why


@pytest.mark.parametrize("argv, why", [
    (["--service-kind=triton_c_api"], "needs the in-process C API"),
    (["--service-kind", "torchserve"], "another server's protocol"),
    (["--measurement-mode", "count_windows"], "windows are timed"),
    (["--input-tensor-format=json"], "binary extension"),
    (["--output-tensor-format", "json"], "binary extension"),
])
def test_refused_values_named_with_reason(argv, why):
    with pytest.raises(SystemExit) as e:
        bench.main(["-m", "x", *argv])
    text = str(e.value.code)
    value = argv[0].partition("=")[2] or argv[1]
    assert f"{argv[0].partition('=')[0]}={value} is not supported" in text
    assert why in text


def test_input_data_directory_refused(tmp_path):
    with pytest.raises(SystemExit) as e:
        parse("--input-data", str(tmp_path))
    assert "directory of raw input files is not read" in str(e.value.code)


@pytest.mark.parametrize("argv, text", [
    (["--concurrency-range", "1:0"], "search until --latency-threshold"),
    (["--concurrency-range", "4:2"], "end below start"),
    (["--sequence-id-range", "5:5"], "start < end"),
    (["--request-parameter", "a:1:float"], "bool, int or string"),
    (["-H", "nocolon"], "Header:Value"),
])
def test_bad_values_say_why(argv, text, capsys):
    with pytest.raises(SystemExit):
        parse(*argv)
    assert text in capsys.readouterr().err


@pytest.mark.parametrize("argv, text", [
    (["--streaming", "-i", "http"], "--streaming needs -i grpc"),
    (["--streaming", "--request-rate-range", "10"], "closed loop"),
    (["--sync", "--client-impl", "grpc-aio"], "not both"),
])
def test_conflicting_flags_say_why(argv, text):
    with pytest.raises(SystemExit) as e:
        parse(*argv)
    assert text in str(e.value.code)


def test_ranges():
    assert expand_range("4", int) == [4]
    assert expand_range("1:3", int) == [1, 2, 3]
    assert expand_range("0.5:1.5:0.5", float) == [0.5, 1.0, 1.5]
    assert parse_id_range("7") == (7, None)
    assert parse_request_parameter("stream:true:bool") == ("stream", True)
    assert parse_request_parameter("name:a:b:string") == ("name", "a:b")


def test_list_flags_prints_the_table(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--list-flags"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for f in FLAGS:
        assert f.spellings[0] in out


def test_readme_holds_the_table():
    """The README's perf_analyzer table is markdown_table()'s output, so the two
    cannot drift apart."""
    assert markdown_table() in README.read_text()


# --- sequences ------------------------------------------------------------------------


def test_sequence_flags_start_and_end():
    d = SequenceDriver({"length": 3, "variation": 0}, index=0, total=1)
    got = [d.next() for _ in range(6)]
    assert [(r["sequence_start"], r["sequence_end"]) for r in got] == \
        [(True, False), (False, False), (False, True)] * 2
    assert [r["sequence_id"] for r in got] == [1, 1, 1, 2, 2, 2]


def test_sequence_of_one_request_starts_and_ends():
    d = SequenceDriver({"length": 1, "variation": 0}, index=0, total=1)
    assert d.next() == {"sequence_id": 1, "sequence_start": True, "sequence_end": True}


def test_sequence_lengths_vary_within_bounds():
    d = SequenceDriver({"length": 10, "variation": 20}, index=0, total=1, seed=3)
    lengths, n = [], 0
    for _ in range(2000):
        n += 1
        if d.next()["sequence_end"]:
            lengths.append(n)
            n = 0
    assert min(lengths) >= 8 and max(lengths) <= 12 and len(set(lengths)) > 1


def test_sequence_ids_never_shared_between_streams():
    """Rule: live sequences of different streams never share an id, bounded range or
    not, however far one stream runs ahead of another."""
    for end in (None, 1 + 7):
        drivers = [SequenceDriver({"length": 1, "variation": 0, "id_start": 1,
                                   "id_end": end}, g, 3) for g in range(3)]
        ids = [{drivers[g].next()["sequence_id"] for _ in range(10 * (g + 1))}
               for g in range(3)]
        assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
        if end is not None:
            assert set().union(*ids) <= set(range(1, end))


def test_sequence_close_and_failure():
    d = SequenceDriver({"length": 4, "variation": 0}, 0, 1)
    assert d.close() is None  # nothing open
    d.next()
    assert d.close() == {"sequence_id": 1, "sequence_start": False, "sequence_end": True}
    assert d.next()["sequence_start"] and d.id == 2
    d.failed()
    assert d.next() == {"sequence_id": 3, "sequence_start": True, "sequence_end": False}


def test_id_range_smaller_than_concurrency_refused():
    cfg = parse("--sequence-id-range", "1:3", "--concurrency-range", "1:4")[1]
    with pytest.raises(ValueError, match="fewer than the 4 sequences"):
        bench.sequence_plan(cfg)


# --- streaming figures ----------------------------------------------------------------


def test_streaming_figures_summarized():
    rec = Recorder(0.0, 0.0, 1e9, None)
    rec.done_stream(0.0, 0.002, 4, True)
    rec.done_stream(0.0, 0.004, 4, True, ended=True)
    part = rec.result()
    part["seconds"] = 2.0
    row = bench.summarize([part], protocol="grpc", shape=[4], dtype="INT32",
                          concurrency=1, shm="none", impl="grpc-stream")
    assert row.responses == 8 and row.responses_per_s == 4.0 and row.sequences == 1
    assert row.ttft_p50_ms == pytest.approx(3.0) and row.ttft_mean_ms == pytest.approx(3.0)
    assert any("responses/s" in line for line in bench.point_lines(row))


# --- -f -------------------------------------------------------------------------------

PA_HEADER = ("Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,"
             "Server Queue,Server Compute Input,Server Compute Infer,"
             "Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,"
             "p99 latency")


def _row(conc, tput, mean_ms, **kw):
    return {"concurrency": conc, "throughput": tput, "mean_ms": mean_ms,
            "p50_ms": 1.0, "p90_ms": 2.0, "p95_ms": 3.0, "p99_ms": 4.0,
            "server_stats": {"requests": 10, "queue_us": 100.4, "compute_input_us": 20.0,
                             "compute_infer_us": 300.9, "compute_output_us": 5.0}, **kw}


def test_pa_csv_layout(tmp_path):
    """perf_analyzer's header, in its order; rows by increasing throughput; whole
    microseconds; the network share is what the server's phases leave of the
    average."""
    path = tmp_path / "out.csv"
    write_pa_csv(str(path), [_row(2, 900.5, 2.0), _row(1, 500.25, 1.5)])
    lines = path.read_text().splitlines()
    assert lines[0] == PA_HEADER
    rows = list(csv.reader(lines[1:]))
    assert [r[0] for r in rows] == ["1", "2"]
    assert rows[0] == ["1", "500.25", "0", str(1500 - 100 - 20 - 300 - 5), "100", "20",
                       "300", "5", "0", "1000", "2000", "3000", "4000"]


def test_pa_csv_verbose_and_percentile_and_rate():
    lines = pa_csv_lines([_row(1, 10.0, 1.0, percentile=85.0, pct_ms=1.5,
                               request_rate=20.0)], verbose=True)
    assert lines[0] == ["Request Rate"] + PA_HEADER.split(",")[1:9] + [
        "p50 latency", "p85 latency", "p90 latency", "p95 latency", "p99 latency",
        "Avg latency", "request/response", "response wait"]
    assert lines[1][0] == "20" and lines[1][10] == 1500 and lines[1][-3:] == [1000, 0, 1000]


def test_pa_csv_without_server_statistics():
    lines = pa_csv_lines([{"concurrency": 1, "throughput": 5.0, "mean_ms": math.nan}])
    assert lines[1][:9] == [1, "5", 0, 0, 0, 0, 0, 0, 0]


# --- a sequence model's data streams --------------------------------------------------


def test_input_data_streams_parsed():
    from scheduler.bench.inputs import TensorSpec, parse_input_data, parse_input_streams
    spec = [TensorSpec("INPUT", "INT32", [1])]
    doc = {"data": [[{"INPUT": [1]}, {"INPUT": [2]}], [{"INPUT": [5]}]]}
    streams = parse_input_streams(doc, spec)
    assert [[int(e["INPUT"][0]) for e in s] for s in streams] == [[1, 2], [5]]
    assert [int(e["INPUT"][0]) for e in parse_input_data(doc, spec)] == [1, 2, 5]
    flat = parse_input_streams({"data": [{"INPUT": [7]}, {"INPUT": [8]}]}, spec)
    assert len(flat) == 1 and len(flat[0]) == 2  # a flat list is one stream
    with pytest.raises(ValueError, match="stream 1 is empty"):
        parse_input_streams({"data": [[{"INPUT": [1]}], []]}, spec)


def test_sequences_step_through_data_streams():
    """Rule (perf_analyzer's): without --sequence-length a sequence is as long as its
    data stream; new sequences take the streams in turn; each request sends its step."""
    np = pytest.importorskip("numpy")
    grpcclient = pytest.importorskip("tritonclient.grpc")
    from scheduler.bench.client import PointSpec, Stream
    from scheduler.bench.inputs import TensorSpec, parse_input_streams
    spec = PointSpec(url="x", protocol="grpc", impl="grpc-callback", model="m", timeout=1,
                     inputs=[{"name": "INPUT", "datatype": "INT32", "shape": [1]}],
                     outputs=[], streams=1, shm="none", verify=False, warmup=0,
                     duration=1, max_requests=None, tag="t", total_streams=1,
                     sequence={"length": None, "variation": 0.0, "id_start": 1,
                               "id_end": None})
    streams = parse_input_streams(
        {"data": [[{"INPUT": [1]}, {"INPUT": [2]}, {"INPUT": [3]}], [{"INPUT": [5]}]]},
        [TensorSpec("INPUT", "INT32", [1])])
    s = Stream(spec, 0, grpcclient, [e for st in streams for e in st], streams)
    sent = []
    for _ in range(6):
        kw, ended = s.request({})
        raw = s.inputs[0].request._get_content()
        sent.append((int(np.frombuffer(raw, dtype=np.int32)[0]), kw["sequence_start"],
                     ended, kw["sequence_id"]))
    assert sent == [(1, True, False, 1), (2, False, False, 1), (3, False, True, 1),
                    (5, True, True, 2), (1, True, False, 3), (2, False, False, 3)]


def test_sequence_plan_lengths():
    assert bench.sequence_plan(parse()[1])["length"] == 20  # perf_analyzer's default
    plan = bench.sequence_plan(parse("--sequence-length", "4")[1])
    assert plan["length"] == 4 and plan["variation"] == 20


def test_sequence_plan_from_data(tmp_path):
    plan = bench.sequence_plan(parse("--input-data", _data_file(tmp_path))[1])
    assert plan["length"] is None and plan["variation"] == 0  # the data's, not varied
    with pytest.raises(ValueError, match="--shared-memory none"):
        bench.sequence_plan(parse("--input-data", _data_file(tmp_path),
                                  "--shared-memory", "system")[1])


def test_latency_threshold_ends_the_sweep():
    from scheduler.bench.report import over_threshold
    row = bench.Row(protocol="grpc", shape=[1], dtype="FP32", concurrency=1, shm="none",
                    requests=1, seconds=1, throughput=1, p50_ms=1, p90_ms=1, p99_ms=1,
                    mean_ms=5.0, errors=0, mismatches=0, client_cpu=0,
                    client_processes=1, client_impl="grpc-callback")
    assert not over_threshold([], 1.0) and not over_threshold([row], None)
    assert over_threshold([row], 4.0) and not over_threshold([row], 5.0)
    row.percentile, row.pct_ms = 95.0, 3.0  # with --percentile, that latency decides
    assert not over_threshold([row], 4.0)


# --- validation_data ------------------------------------------------------------------


def test_validation_data_parsed_in_the_data_layout():
    from scheduler.bench.inputs import parse_validation_streams
    outs = [{"name": "OUTPUT", "datatype": "INT32"}, {"name": "TEXT", "datatype": "BYTES"}]
    doc = {"data": [[{"I": [1]}, {"I": [2]}]],
           "validation_data": [[{"OUTPUT": [1]}, {"OUTPUT": {"content": [3]},
                                                  "TEXT": ["a"]}]]}
    got = parse_validation_streams(doc, outs)
    assert [int(got[0][0]["OUTPUT"][0]), int(got[0][1]["OUTPUT"][0])] == [1, 3]
    assert got[0][1]["TEXT"].tolist() == [b"a"]
    assert parse_validation_streams({"data": [{"I": [1]}]}, outs) is None
    with pytest.raises(ValueError, match="same layout"):
        parse_validation_streams({"data": [[{"I": [1]}]], "validation_data": [[]]}, outs)
    with pytest.raises(ValueError, match="no output the bench asks for: NOPE"):
        parse_validation_streams({"data": [{"I": [1]}],
                                  "validation_data": [{"NOPE": [1]}]}, outs)


def test_validation_data_checked_per_step():
    """Rule: a response whose outputs differ from the step's validation_data is a
    mismatch; outputs it does not name are not checked."""
    np = pytest.importorskip("numpy")
    grpcclient = pytest.importorskip("tritonclient.grpc")
    from scheduler.bench.client import PointSpec, Stream
    from scheduler.bench.inputs import (
        TensorSpec, parse_input_streams, parse_validation_streams,
    )
    doc = {"data": [[{"INPUT": [1]}, {"INPUT": [2]}]],
           "validation_data": [[{"OUTPUT": [1]}, {"OUTPUT": [3]}]]}
    outputs = [{"name": "OUTPUT", "datatype": "INT32", "nbytes": -1},
               {"name": "OTHER", "datatype": "INT32", "nbytes": -1}]
    spec = PointSpec(url="x", protocol="grpc", impl="grpc-callback", model="m", timeout=1,
                     inputs=[{"name": "INPUT", "datatype": "INT32", "shape": [1]}],
                     outputs=outputs, streams=1, shm="none", verify=False, warmup=0,
                     duration=1, max_requests=None, tag="t", total_streams=1,
                     sequence={"length": None, "variation": 0.0, "id_start": 1,
                               "id_end": None})
    streams = parse_input_streams(doc, [TensorSpec("INPUT", "INT32", [1])])
    s = Stream(spec, 0, grpcclient, None, streams, parse_validation_streams(doc, outputs))

    def result(v):
        return _Named({"OUTPUT": np.array([[v]], dtype=np.int32),
                       "OTHER": np.array([0], dtype=np.int32)})
    s.request({})
    assert s.check(result(1)) and not s.check(result(3))
    s.request({})
    assert s.check(result(3)) and not s.check(result(1))


class _Named:
    def __init__(self, arrays):
        self.arrays = arrays

    def as_numpy(self, name):
        return self.arrays.get(name)
