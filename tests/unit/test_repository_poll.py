"""Poll mode's change detection (a pure function of two snapshots), the directory
fingerprint it compares, and the load API's file paths and config override."""

from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace

import pytest

from scheduler.repository.config import ConfigError
from scheduler.repository.control import ModelControl, directory_name, file_path, not_a_directory_name, poll_failure
from scheduler.repository.poller import changes
from scheduler.repository.disk import fingerprint, parse_override
from shm.errors import ErrorCode, InferError


def test_changes_finds_added_removed_and_changed_models():
    """Rule: a model new in the second snapshot is added, one missing is removed, one
    whose fingerprint differs is changed; identical ones are left alone."""
    before = {"a": (1,), "b": (2,), "c": (3,)}
    after = {"b": (2,), "c": (4,), "d": (5,)}
    found = changes(before, after)
    assert (found.added, found.removed, found.changed) == (["d"], ["a"], ["c"])
    assert not changes(after, dict(after))
    assert changes({}, {"x": ()}).added == ["x"]


def _model(tmp_path):
    model = tmp_path / "m"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text('name: "m"\n')
    (model / "1" / "model.py").write_text("x = 1\n")
    return model


def test_fingerprint_changes_with_config_files_and_version_dirs(tmp_path):
    """Rule: editing config.pbtxt, touching a model file, adding an (even empty)
    version directory or removing a file each change the fingerprint; hidden entries
    and an untouched directory do not."""
    model = _model(tmp_path)
    first = fingerprint(model)
    assert fingerprint(model) == first
    (model / ".ipynb_checkpoints").mkdir()
    (model / ".hidden").write_text("ignored")
    assert fingerprint(model) == first

    (model / "config.pbtxt").write_text('name: "m"\nmax_batch_size: 4\n')
    second = fingerprint(model)
    assert second != first

    st = os.stat(model / "1" / "model.py")
    os.utime(model / "1" / "model.py", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    third = fingerprint(model)
    assert third != second

    (model / "2").mkdir()
    fourth = fingerprint(model)
    assert fourth != third
    (model / "2").rmdir()
    (model / "1" / "model.py").unlink()
    assert fingerprint(model) not in (first, second, third, fourth)


def test_fingerprint_of_a_missing_directory_is_empty(tmp_path):
    """A model directory removed between scan and fingerprint has none."""
    assert fingerprint(tmp_path / "gone") == ()


@pytest.mark.parametrize("key,path", [("file:1/model.py", "1/model.py"),
                                      ("file:config.pbtxt", "config.pbtxt"),
                                      ("file:1/sub/../model.onnx", "1/model.onnx")])
def test_file_parameters_name_paths_inside_the_model(key, path):
    """Rule: `file:<version>/<name>` names a file under the model's directory."""
    assert file_path(key) == path


@pytest.mark.parametrize("key", ["file:", "file:/etc/passwd", "file:../x", "file:1/../../x",
                                 "file:."])
def test_file_parameters_that_leave_the_model_are_refused(key):
    """Rule: a file path that is absolute or climbs out of the model's private
    directory is refused (the load fails), never written."""
    with pytest.raises(ValueError):
        file_path(key)


def test_config_override_parses_json_and_checks_the_name():
    """Rule: the `config` parameter is a JSON ModelConfig; its name defaults to the
    model's and must equal it; JSON that does not parse is a config error."""
    config = parse_override('{"backend": "python", "max_batch_size": 4}', "m")
    assert (config.name, config.backend, config.max_batch_size) == ("m", "python", 4)
    with pytest.raises(ConfigError, match="directory name must equal model name"):
        parse_override('{"name": "other"}', "m")
    with pytest.raises(ConfigError, match="Invalid config override"):
        parse_override("{not json", "m")
    with pytest.raises(ConfigError, match="Invalid config override"):
        parse_override('{"input": [{"data_type": "TYPE_BOGUS"}]}', "m")
    # nested past json's stack: RecursionError escaped the load (issue 25)
    for deep in ('{"a":' * 100_000 + "1" + "}" * 100_000, "[" * 100_000 + "]" * 100_000):
        with pytest.raises(ConfigError, match="Invalid config override"):
            parse_override(deep, "m")


def test_poll_failure_is_tritons_words():
    err = poll_failure("m")
    assert err.code == ErrorCode.INTERNAL
    assert err.message == "failed to load 'm', failed to poll from model repository"


def test_http_load_parameters_decode_base64_files_and_refuse_non_strings():
    """Rule: over HTTP `config` is a JSON string and each `file:` parameter base64;
    other parameters are not the load's; a non-string answers Triton's JSON error
    (500) and bad base64 a 400."""
    from frontend.repository_endpoints import http_load_arguments
    config, files = http_load_arguments({"config": "{}", "file:1/model.py": "AGNvZGU=",
                                         "other": 3})
    assert (config, files) == ("{}", {"file:1/model.py": b"\x00code"})
    assert http_load_arguments({}) == (None, {})
    with pytest.raises(Exception) as e:
        http_load_arguments({"config": 5})
    assert (e.value.code, e.value.message) == (
        ErrorCode.INTERNAL, "attempt to access JSON non-string as string")
    with pytest.raises(Exception) as e:
        http_load_arguments({"config": "{}", "file:1/model.py": "!!!"})
    assert e.value.code == ErrorCode.INVALID_ARG


BAD_NAMES = ["../escaped", "../../escaped", "a/b", "..", ".", "", "nul\0name", "x" * 256]


@pytest.mark.parametrize("name", ["m", "ok name", "über", "a\\b", ".hidden", "x" * 255])
def test_model_names_that_are_directory_names(name):
    assert directory_name(name)


@pytest.mark.parametrize("name", BAD_NAMES + ["/abs/escaped"])
def test_model_names_that_are_not_directory_names(name):
    assert not directory_name(name)


def _control(tmp_path) -> ModelControl:
    state = tmp_path / "state"
    state.mkdir()
    args = SimpleNamespace(model_control_mode="explicit", state_dir=str(state),
                           repository_poll_secs=0)
    return ModelControl(manager=None, args=args)


def _written(tmp_path) -> list[str]:
    return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))


@pytest.mark.parametrize("name", BAD_NAMES + ["ABS"])
def test_a_load_whose_name_leaves_its_folder_writes_nothing(tmp_path, name):
    """Rule (issue 25): the name of a load with files named the directory they were
    written to, unchecked: '../x' or an absolute path wrote them outside the private
    folder. Such a name is refused as the client's fault (INVALID_ARGUMENT, Triton's
    code for a load with files that fails), and nothing is written."""
    control = _control(tmp_path)
    if name == "ABS":
        name = str(tmp_path / "escaped")
    before = _written(tmp_path)
    config = '{"backend": "python"}'
    with pytest.raises(InferError) as e:
        asyncio.run(control.load(name, config, {"file:1/model.py": b"pass"}))
    assert e.value.code == ErrorCode.INVALID_ARG
    assert e.value.message == not_a_directory_name(name).message
    assert _written(tmp_path) == before


@pytest.mark.parametrize("name", ["../escaped", "../../escaped", "/abs/escaped", ".."])
def test_the_files_folder_is_checked_once_resolved_too(tmp_path, name):
    """Below the name check, the model folder's resolved path must be the private
    folder's child (a second line, for a name the first one let through)."""
    control = _control(tmp_path)
    before = _written(tmp_path)
    with pytest.raises(InferError):
        control._source(name, "{}", {"file:1/model.py": b"pass"})
    assert _written(tmp_path) == before
