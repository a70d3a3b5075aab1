"""The logging extension's settings (scheduler/log_settings.py), how every process
applies them (shm/log.py), and how the frontends read a client's settings
(frontend/settings_endpoints.py)."""

import logging
import re

import pytest
from tritonclient.grpc import service_pb2

from frontend.settings_endpoints import (log_update_of, parse_settings_body,
                                         trace_update_of)
from scheduler.cli import parse_args
from scheduler.log_settings import apply_update
from shm.errors import ErrorCode, InferError
from shm.log import LevelSwitch, TritonFormatter, configure_logging
from shm.messages.settings import LogSettings


def test_flags_become_the_settings():
    """--log-verbose/--log-info/--log-warning/--log-error/--log-format/--log-file are
    the settings every process starts with."""
    args = parse_args(["--model-repository", "x", "--log-verbose", "2", "--log-info",
                       "false", "--log-warning", "false", "--log-error", "false",
                       "--log-format", "ISO8601", "--log-file", "/tmp/l.txt"])
    assert args.log_settings == LogSettings("/tmp/l.txt", False, False, False, 2, "ISO8601")
    assert parse_args(["--model-repository", "x"]).log_settings == LogSettings()
    with pytest.raises(SystemExit):
        parse_args(["--model-repository", "x", "--log-format", "json"])


def test_update_changes_only_what_it_names():
    """Named settings change, others stay; null changes nothing; unknown names are
    ignored (as Triton)."""
    cur = LogSettings(log_file="/tmp/f")
    new = apply_update(cur, {"log_verbose_level": 1, "log_info": False, "log_error": None,
                             "log_format": "ISO8601", "colour": "red"})
    assert new == LogSettings("/tmp/f", False, True, True, 1, "ISO8601")
    assert apply_update(cur, {}) is cur


@pytest.mark.parametrize("update,code,message", [
    ({"log_file": "/tmp/other"}, ErrorCode.UNSUPPORTED,
     "log file location can not be updated through network protocol"),
    ({"log_info": 1}, ErrorCode.INVALID_ARG, "expect boolean for 'log_info'"),
    ({"log_warning": "true"}, ErrorCode.INVALID_ARG, "expect boolean for 'log_warning'"),
    ({"log_verbose_level": -1}, ErrorCode.INVALID_ARG, "'log_verbose_level' must be in"),
    ({"log_verbose_level": True}, ErrorCode.INVALID_ARG,
     "expect unsigned integer for 'log_verbose_level'"),
    ({"log_verbose_level": "1"}, ErrorCode.INVALID_ARG,
     "expect unsigned integer for 'log_verbose_level'"),
    ({"log_format": "json"}, ErrorCode.INVALID_ARG,
     "invalid argument for log_format, got: json"),
    ({"log_format": 1}, ErrorCode.INVALID_ARG, "expect string for 'log_format'"),
    # good values first do not get applied when a later one is bad
    ({"log_verbose_level": 3, "log_error": "no"}, ErrorCode.INVALID_ARG,
     "expect boolean for 'log_error'"),
])
def test_bad_update_is_an_error(update, code, message):
    with pytest.raises(InferError) as e:
        apply_update(LogSettings(), update)
    assert e.value.code == code and message in e.value.message


def _record(level, msg="hello"):
    r = logging.LogRecord("shmserve.x", level, "/a/b/core.py", 88, msg, None, None)
    r.created = 1795515135.123456  # 2026-11-24 10:12:15.123456 UTC
    return r


def test_line_layouts_are_tritons():
    """default: <L><MMDD> <HH:MM:SS.uuuuuu> <pid> <role> <file>:<line>] msg;
    ISO8601: <YYYY-MM-DDTHH:MM:SSZ> <L> <pid> <role> <file>:<line>] msg."""
    line = TritonFormatter("frontend[0]").format(_record(logging.WARNING))
    assert re.fullmatch(r"W1124 10:12:15\.12345\d \d+ frontend\[0\] core\.py:88\] hello",
                        line), line
    line = TritonFormatter("scheduler", "ISO8601").format(_record(logging.ERROR))
    assert re.fullmatch(r"2026-11-24T10:12:15Z E \d+ scheduler core\.py:88\] hello", line)


def test_level_switches():
    """log_info/log_warning/log_error turn their level off; verbose lines need
    log_verbose_level > 0."""
    f = LevelSwitch(LogSettings(log_info=False, log_error=False))
    assert [f.filter(_record(n)) for n in (logging.DEBUG, logging.INFO, logging.WARNING,
                                           logging.ERROR)] == [False, False, True, False]
    f = LevelSwitch(LogSettings(log_verbose_level=1))
    assert f.filter(_record(logging.DEBUG))


def test_configure_logging_appends_to_file_and_reconfigures(tmp_path):
    """With log_file, lines are appended to it; new settings take effect at once."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    path = tmp_path / "log.txt"
    path.write_text("earlier line\n")
    try:
        configure_logging("worker[t]", LogSettings(log_file=str(path)))
        log = logging.getLogger("shmserve.test")
        log.debug("quiet verbose")
        log.info("first info")
        configure_logging("worker[t]", LogSettings(log_file=str(path), log_verbose_level=1,
                                                   log_format="ISO8601"))
        log.debug("loud verbose")
        text = path.read_text()
    finally:
        import shm.log
        if shm.log._installed is not None:
            root.removeHandler(shm.log._installed)
            shm.log._installed.close()
            shm.log._installed = None
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    lines = text.splitlines()
    assert lines[0] == "earlier line"
    assert "first info" in lines[1] and " worker[t] " in lines[1]
    assert "quiet verbose" not in text
    assert re.match(r"\d{4}-\d\d-\d\dT", lines[2]) and lines[2].endswith("loud verbose")


# -- what the frontends forward ---------------------------------------------------------

def test_http_body_parsing():
    """An empty body is an empty update (as Triton); a body that is not a JSON object is
    a clear error."""
    assert parse_settings_body(b"", "logging") == {}
    assert parse_settings_body(b'{"log_info": false}', "logging") == {"log_info": False}
    for body in (b"{not json", b"[1, 2]", b'"text"'):
        with pytest.raises(InferError) as e:
            parse_settings_body(body, "logging")
        assert e.value.code == ErrorCode.INVALID_ARG
        assert "failed to parse the logging request JSON buffer" in e.value.message


def test_grpc_settings_become_plain_values():
    """LogSettings: the SettingValue field that is set; TraceSetting: lists of
    strings. No settings at all is a read."""
    req = service_pb2.LogSettingsRequest()
    assert log_update_of(req) is None
    req.settings["log_info"].bool_param = False
    req.settings["log_verbose_level"].uint32_param = 2
    req.settings["log_format"].string_param = "ISO8601"
    req.settings["log_error"].SetInParent()  # no field set
    assert log_update_of(req) == {"log_info": False, "log_verbose_level": 2,
                                  "log_format": "ISO8601", "log_error": None}
    treq = service_pb2.TraceSettingRequest(model_name="m")
    assert trace_update_of(treq) is None
    treq.settings["trace_rate"].value.append("5")
    treq.settings["trace_level"].value.extend(["TIMESTAMPS"])
    treq.settings["trace_count"].SetInParent()
    assert trace_update_of(treq) == {"trace_rate": ["5"], "trace_level": ["TIMESTAMPS"],
                                     "trace_count": []}
