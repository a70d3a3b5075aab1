"""The trace extension's settings, sampling and file layout (scheduler/trace.py), with
no server: Triton's TraceManager rules, one test each."""

import json
from types import SimpleNamespace

import pytest

from scheduler.trace import (TraceConfig, TraceManager, parse_trace_config, parse_update,
                             request_timestamps, trace_records)
from shm.errors import ErrorCode, InferError


def manager(tmp_path, **config) -> TraceManager:
    config.setdefault("file", str(tmp_path / "trace.json"))
    return TraceManager(TraceConfig(**config))


def run(m: TraceManager, model: str, n: int) -> list[int]:
    """n requests of `model`, each completed at once; the trace ids given out."""
    ids = []
    for i in range(n):
        tid = m.sample(model, 1, f"r{i}")
        if tid:
            ids.append(tid)
            m.complete(tid, [("REQUEST_START", 10 * i), ("REQUEST_END", 10 * i + 5)])
    return ids


def traces_in(path) -> dict[int, list[dict]]:
    """A trace file's records grouped by trace id (the file must be valid JSON)."""
    out: dict[int, list[dict]] = {}
    for record in json.loads(path.read_text()):
        out.setdefault(record["id"], []).append(record)
    return out


# -- --trace-config -----------------------------------------------------------------

def test_trace_config_reads_tritonservers_syntax():
    """--trace-config [<mode>,]<setting>=<value>: global rate/level/count/mode, triton
    file/log-frequency; level may repeat."""
    c = parse_trace_config(["triton,file=/tmp/t.json", "triton,log-frequency=50",
                            "rate=100", "level=TIMESTAMPS", "level=TENSORS", "count=7",
                            "mode=triton"])
    assert c == TraceConfig(level=frozenset({"TIMESTAMPS", "TENSORS"}), rate=100, count=7,
                            log_frequency=50, file="/tmp/t.json")
    assert parse_trace_config([]) == TraceConfig(level=frozenset(), rate=1000, count=-1,
                                                 log_frequency=0, file="")
    assert parse_trace_config(["level=OFF"]).level == frozenset()


@pytest.mark.parametrize("item,message", [
    ("rate", "option format is '[<mode>,]<setting>=<value>'"),
    ("rate=abc", "Unable to parse 'trace_rate', got: abc"),
    ("rate=-1", "value is out of range [ 0, 4294967295 ]"),
    ("count=-2", "Expecting value >= -1"),
    ("level=LOUD", "invalid trace level 'LOUD'"),
    ("opentelemetry,url=x", "only the 'triton' trace mode is supported"),
    ("mode=opentelemetry", "only the 'triton' trace mode is supported"),
    ("triton,colour=red", "unknown --trace-config setting"),
    ("file=/tmp/x", "unknown --trace-config setting"),  # file is a triton-mode setting
])
def test_trace_config_rejects_what_tritonserver_rejects(item, message):
    """A malformed --trace-config item is a startup error naming the problem."""
    with pytest.raises(ValueError) as e:
        parse_trace_config([item])
    assert message in str(e.value)


# -- updates ----------------------------------------------------------------------------

def test_update_values_are_strings_and_null_clears():
    """Triton's trace setting values are strings (trace_level a list); null clears;
    names Triton does not update are ignored."""
    assert parse_update({"trace_rate": "5", "trace_count": "-1", "log_frequency": "0",
                         "trace_level": ["TIMESTAMPS"], "trace_mode": "x"}) == {
        "rate": 5, "count": -1, "log_frequency": 0, "level": frozenset({"TIMESTAMPS"})}
    assert parse_update({"trace_rate": None, "trace_level": None}) == {
        "rate": None, "level": None}
    # gRPC: every value a list; empty clears, one value is the value
    assert parse_update({"trace_rate": [], "trace_count": ["3"]}) == {
        "rate": None, "count": 3}
    assert parse_update({"trace_level": ["OFF"]}) == {"level": frozenset()}


@pytest.mark.parametrize("update,code,message", [
    ({"trace_file": "x.json"}, ErrorCode.UNSUPPORTED,
     "trace file location can not be updated through network protocol"),
    ({"trace_rate": 5}, ErrorCode.INVALID_ARG, "expect a string for 'trace_rate'"),
    ({"trace_rate": "five"}, ErrorCode.INVALID_ARG, "Unable to parse 'trace_rate', got: five"),
    ({"trace_rate": "4294967296"}, ErrorCode.INVALID_ARG,
     "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], got: 4294967296"),
    ({"trace_count": "-5"}, ErrorCode.INVALID_ARG,
     "Unable to parse 'trace_count'. Expecting value >= -1, got:-5"),
    ({"log_frequency": ["1", "2"]}, ErrorCode.INVALID_ARG,
     "expect only 1 value for 'log_frequency'"),
    ({"trace_level": ["OFF", "TIMESTAMPS"]}, ErrorCode.INVALID_ARG,
     "Expect only one trace level 'OFF' is specified"),
    ({"trace_level": "TIMESTAMPS"}, ErrorCode.INVALID_ARG,
     "expect an array of strings for 'trace_level'"),
    ({"trace_level": ["LOUD"]}, ErrorCode.INVALID_ARG, "invalid trace level 'LOUD'"),
])
def test_bad_updates_are_errors(update, code, message):
    """Each malformed value is an error of Triton's class with a message naming it."""
    with pytest.raises(InferError) as e:
        parse_update(update)
    assert e.value.code == code
    assert message in e.value.message


def test_bad_update_changes_nothing(tmp_path):
    """A rejected update, even one whose first values are good, leaves every setting as
    it was."""
    m = manager(tmp_path, level=frozenset({"TIMESTAMPS"}), rate=2)
    before = m.settings()
    for bad in ({"trace_rate": "7", "trace_count": "x"},
                {"trace_count": "3", "trace_file": "other.json"}):
        with pytest.raises(InferError):
            m.update("", bad)
    assert m.settings() == before


def test_setting_that_would_be_invalid_is_refused(tmp_path):
    """Turning tracing on without a trace file (or with rate 0) is refused, as Triton:
    the only invalid setting allowed is one that disables tracing."""
    m = TraceManager(TraceConfig())
    with pytest.raises(InferError) as e:
        m.update("", {"trace_level": ["TIMESTAMPS"]})
    assert e.value.message == ("Attempting to set invalid trace setting :trace file name "
                               "is not given")
    m = manager(tmp_path, level=frozenset({"TIMESTAMPS"}))
    with pytest.raises(InferError) as e:
        m.update("", {"trace_rate": "0"})
    assert "sample rate must be non-zero" in e.value.message
    m.update("", {"trace_level": ["OFF"], "trace_rate": "0"})  # allowed: tracing is off
    assert m.settings()["trace_level"] == ["OFF"] and not m.active


def test_describe_is_tritons_get_answer(tmp_path):
    m = manager(tmp_path, level=frozenset({"TIMESTAMPS"}), rate=10, count=4)
    assert m.settings() == {"trace_level": ["TIMESTAMPS"], "trace_rate": "10",
                            "trace_count": "4", "log_frequency": "0",
                            "trace_file": str(tmp_path / "trace.json"),
                            "trace_mode": "triton"}


# -- sampling ---------------------------------------------------------------------------

def test_rate_traces_every_nth_request(tmp_path):
    """trace_rate N: the N-th, 2N-th, ... request is traced."""
    m = manager(tmp_path, level=frozenset({"TIMESTAMPS"}), rate=3)
    picked = [i for i in range(1, 11) if m.sample("a", 1, "")]
    assert picked == [3, 6, 9]


def test_count_stops_tracing_and_reads_back_as_remaining(tmp_path):
    """trace_count N: N traces, then none; GET shows the remaining count (0)."""
    m = manager(tmp_path, level=frozenset({"TIMESTAMPS"}), rate=1, count=2)
    assert len(run(m, "a", 5)) == 2
    assert m.settings()["trace_count"] == "0"
    m.update("", {"trace_count": "1"})  # a new count starts tracing again
    assert len(run(m, "a", 5)) == 1


def test_tracing_off_costs_one_check(tmp_path):
    """Level OFF everywhere: `active` is false and nothing is sampled."""
    m = manager(tmp_path, rate=1)
    assert not m.active and m.sample("a", 1, "") == 0
    m.update("a", {"trace_level": ["TIMESTAMPS"]})
    assert m.active  # a model's own level turns the check on


# -- model settings ---------------------------------------------------------------------

def test_model_setting_overrides_and_follows_global(tmp_path):
    """A model's specified fields override the global ones; the rest follow the global
    setting, also when it changes later; clearing every field drops the model's."""
    m = manager(tmp_path, level=frozenset({"TIMESTAMPS"}), rate=1)
    m.update("b", {"trace_rate": "2"})
    assert m.settings("b")["trace_rate"] == "2"
    assert m.settings("b")["trace_level"] == ["TIMESTAMPS"]
    m.update("", {"trace_count": "9"})
    assert m.settings("b")["trace_count"] == "9"  # unspecified: follows the global
    assert m.settings("b")["trace_rate"] == "2"
    assert [bool(m.sample("b", 1, "")) for _ in range(4)] == [False, True, False, True]
    m.update("c", {"trace_level": ["OFF"]})
    assert run(m, "c", 3) == []  # off for c only
    assert len(run(m, "a", 3)) == 3
    m.update("b", {"trace_rate": None})
    assert m.settings("b") == m.settings()  # nothing of its own left: the global one


def test_clearing_global_falls_back_to_the_command_line(tmp_path):
    """null on the global setting restores the --trace-config value."""
    m = manager(tmp_path, level=frozenset({"TIMESTAMPS"}), rate=7)
    m.update("", {"trace_rate": "1"})
    m.update("", {"trace_rate": None})
    assert m.settings()["trace_rate"] == "7"


def test_unknown_model_uses_global_setting(tmp_path):
    m = manager(tmp_path, level=frozenset({"TIMESTAMPS"}), rate=5)
    assert m.settings("nobody") == m.settings()


# -- the file ---------------------------------------------------------------------------

def test_record_layout_is_tritons():
    """A trace: the model record (request_id only when set), then one record per
    timestamp, each {"id", "timestamps": [{"name", "ns"}]}."""
    text = trace_records(7, "m", 2, "req-1", [("REQUEST_START", 1), ("REQUEST_END", 9)])
    assert json.loads(b"[" + text + b"]") == [
        {"id": 7, "model_name": "m", "model_version": 2, "request_id": "req-1"},
        {"id": 7, "timestamps": [{"name": "REQUEST_START", "ns": 1}]},
        {"id": 7, "timestamps": [{"name": "REQUEST_END", "ns": 9}]}]
    assert json.loads(trace_records(1, "m", 1, "", [])) == {
        "id": 1, "model_name": "m", "model_version": 1}


def test_request_timestamps_in_tritons_order():
    req = SimpleNamespace(req=SimpleNamespace(start_ns=1), queue_ns=2)  # a Queued
    done = SimpleNamespace(compute_start_ns=3, input_end_ns=4, output_start_ns=5,
                           compute_end_ns=6)
    assert request_timestamps(req, done, 7) == [
        ("REQUEST_START", 1), ("QUEUE_START", 2), ("COMPUTE_START", 3),
        ("COMPUTE_INPUT_END", 4), ("COMPUTE_OUTPUT_START", 5), ("COMPUTE_END", 6),
        ("REQUEST_END", 7)]
    # failed before it ran (e.g. cancelled in the queue): no compute records
    assert [n for n, _ in request_timestamps(req, None, 7)] == [
        "REQUEST_START", "QUEUE_START", "REQUEST_END"]


def test_count_exhausted_writes_indexed_file(tmp_path):
    """When trace_count runs out and its traces are collected, they are written to
    <file>.0 at once, as Triton does."""
    m = manager(tmp_path, level=frozenset({"TIMESTAMPS"}), rate=1, count=3)
    run(m, "a", 10)
    traces = traces_in(tmp_path / "trace.json.0")
    assert sorted(traces) == [1, 2, 3]
    assert traces[1][0] == {"id": 1, "model_name": "a", "model_version": 1,
                            "request_id": "r0"}
    assert not (tmp_path / "trace.json").exists()


def test_log_frequency_splits_into_indexed_files(tmp_path):
    """log_frequency N: every N traces go to the next <file>.<k>; the rest at close."""
    m = manager(tmp_path, level=frozenset({"TIMESTAMPS"}), rate=1, log_frequency=2)
    run(m, "a", 5)
    assert sorted(traces_in(tmp_path / "trace.json.0")) == [1, 2]
    assert sorted(traces_in(tmp_path / "trace.json.1")) == [3, 4]
    assert not (tmp_path / "trace.json.2").exists()
    m.close()
    assert sorted(traces_in(tmp_path / "trace.json.2")) == [5]


def test_main_file_written_on_replace_and_close_and_stays_valid_json(tmp_path):
    """log_frequency 0: a setting's traces go to the trace file when it is replaced and
    when the server stops; the file is one JSON array after every write."""
    m = manager(tmp_path, level=frozenset({"TIMESTAMPS"}), rate=1)
    run(m, "a", 2)
    assert not (tmp_path / "trace.json").exists()
    m.update("", {"trace_rate": "1"})  # replaced: its two traces are written
    assert sorted(traces_in(tmp_path / "trace.json")) == [1, 2]
    run(m, "a", 1)
    m.close()
    assert sorted(traces_in(tmp_path / "trace.json")) == [1, 2, 3]


def test_trace_sampled_under_replaced_setting_is_still_written(tmp_path):
    """A trace in flight when its setting is replaced is written with that setting's
    traces once it completes."""
    m = manager(tmp_path, level=frozenset({"TIMESTAMPS"}), rate=1)
    tid = m.sample("a", 1, "late")
    m.update("", {"trace_level": ["OFF"]})
    assert not (tmp_path / "trace.json").exists()  # waits for its outstanding trace
    m.complete(tid, [("REQUEST_START", 1), ("REQUEST_END", 2)])
    assert traces_in(tmp_path / "trace.json")[tid][0]["request_id"] == "late"
