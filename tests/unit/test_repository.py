"""Tests for scheduler.repository.disk: finding models, choosing versions, planning a load."""

from pathlib import Path

import pytest
from tritonclient.grpc.model_config_pb2 import ModelConfig, ModelInstanceGroup

from scheduler.repository.config import ConfigError, normalize, parse_config
from scheduler.repository.disk import (
    ModelPlan,
    ModelSource,
    RepositoryError,
    available_versions,
    missing_versions,
    plan_model,
    scan,
    select_versions,
)

IDENTITY = """
backend: "python"
max_batch_size: 8
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }]
"""


def make_model(repo: Path, name: str, config: str | None = IDENTITY,
               versions=(1,), filename: str = "model.py") -> Path:
    """A model directory with an optional config.pbtxt and version folders."""
    model = repo / name
    model.mkdir(parents=True)
    if config is not None:
        (model / "config.pbtxt").write_text(config)
    for version in versions:
        (model / str(version)).mkdir()
        (model / str(version) / filename).write_text("# model\n")
    return model


def policy(text: str) -> ModelConfig:
    return normalize(parse_config(f'name: "m" backend: "python" {text}', "test"))


# --- scan ---------------------------------------------------------------------------


def test_scan_finds_model_directories_only(tmp_path):
    make_model(tmp_path, "b_model")
    make_model(tmp_path, "a_model")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "README.md").write_text("not a model")
    found = scan([tmp_path])
    assert list(found) == ["a_model", "b_model"]
    assert found["a_model"] == ModelSource("a_model", tmp_path / "a_model")


def test_scan_merges_repositories(tmp_path):
    make_model(tmp_path / "r1", "one")
    make_model(tmp_path / "r2", "two")
    found = scan([tmp_path / "r1", tmp_path / "r2"])
    assert found["one"].path == tmp_path / "r1" / "one"
    assert found["two"].path == tmp_path / "r2" / "two"


def test_scan_rejects_a_name_in_two_repositories(tmp_path):
    first = make_model(tmp_path / "r1", "same")
    second = make_model(tmp_path / "r2", "same")
    with pytest.raises(RepositoryError) as info:
        scan([tmp_path / "r1", tmp_path / "r2"])
    message = str(info.value)
    assert "not unique across all model repositories" in message
    assert str(first) in message and str(second) in message


def test_scan_rejects_missing_repository(tmp_path):
    with pytest.raises(RepositoryError, match="does not exist"):
        scan([tmp_path / "nowhere"])


def test_scan_of_empty_repository_is_empty(tmp_path):
    assert scan([tmp_path]) == {}


# --- available_versions -------------------------------------------------------------


def test_available_versions_are_numeric_directories_sorted_numerically(tmp_path):
    model = make_model(tmp_path, "m", versions=(10, 2, 1))
    for name in ("01", "abc", "warmup", "1a", "-1"):
        (model / name).mkdir()
    (model / "7").write_text("a file, not a version")
    assert available_versions(model) == [1, 2, 10]


def test_version_zero_is_a_version(tmp_path):
    # Triton ignores leading zeros ("00") but loads a directory named "0".
    model = make_model(tmp_path, "m", versions=(0,))
    (model / "00").mkdir()
    assert available_versions(model) == [0]


# --- select_versions ----------------------------------------------------------------


def test_latest_one_by_default():
    assert select_versions(policy(""), [1, 3, 2]) == [3]


def test_latest_n():
    assert select_versions(policy("version_policy { latest { num_versions: 2 } }"),
                           [1, 5, 3]) == [3, 5]
    assert select_versions(policy("version_policy { latest { num_versions: 9 } }"),
                           [1, 2]) == [1, 2]


def test_all_versions():
    assert select_versions(policy("version_policy { all {} }"), [4, 1, 2]) == [1, 2, 4]


def test_specific_versions():
    config = policy("version_policy { specific { versions: [ 1, 3 ] } }")
    assert select_versions(config, [1, 2, 3]) == [1, 3]


def test_specific_version_missing_is_skipped_and_reported():
    # Triton logs a missing specific version and loads the ones that exist.
    config = policy("version_policy { specific { versions: [ 1, 4 ] } }")
    assert select_versions(config, [1, 2]) == [1]
    assert missing_versions(config, [1, 2]) == [4]


def test_no_version_available_is_an_error():
    message = "at least one version must be available under the version policy of model 'm'"
    with pytest.raises(RepositoryError, match=message):
        select_versions(policy(""), [])
    with pytest.raises(RepositoryError, match=message):
        select_versions(policy("version_policy { specific { versions: [ 7 ] } }"), [1, 2])
    with pytest.raises(RepositoryError, match=message):
        select_versions(policy("version_policy { latest { num_versions: 0 } }"), [1])


# --- plan_model ---------------------------------------------------------------------


def test_plan_python_model(tmp_path):
    model = make_model(tmp_path, "identity", versions=(1, 3))
    plan = plan_model(ModelSource("identity", model))
    assert isinstance(plan, ModelPlan)
    assert (plan.name, plan.path, plan.versions, plan.warnings) == ("identity", model, [3], [])
    assert plan.config.name == "identity"
    assert plan.config.default_model_filename == "model.py"
    assert plan.config.instance_group[0].kind == ModelInstanceGroup.KIND_CPU
    assert plan.config.instance_group[0].name == "identity"


def test_plan_with_gpu_puts_instances_on_gpu(tmp_path):
    model = make_model(tmp_path, "identity")
    plan = plan_model(ModelSource("identity", model), has_gpu=True, gpu_ids=[0, 1])
    group = plan.config.instance_group[0]
    assert group.kind == ModelInstanceGroup.KIND_GPU
    assert list(group.gpus) == [0, 1]


def test_plan_without_config_detects_backend_from_files(tmp_path):
    model = make_model(tmp_path, "net", config=None, versions=(1,), filename="model.onnx")
    plan = plan_model(ModelSource("net", model))
    assert plan.config.backend == "onnxruntime"
    assert plan.config.platform == "onnxruntime_onnx"
    assert plan.versions == [1]


def test_plan_reports_config_errors(tmp_path):
    model = make_model(tmp_path, "bad", config=IDENTITY.replace("dims: [ -1 ]", "dims: [ 0 ]", 1))
    with pytest.raises(ConfigError, match="model input 'INPUT0' dimension must be integer"):
        plan_model(ModelSource("bad", model))


def test_plan_reports_name_mismatch(tmp_path):
    model = make_model(tmp_path, "here", config='name: "there"' + IDENTITY)
    with pytest.raises(ConfigError, match="directory name must equal model name"):
        plan_model(ModelSource("here", model))


def test_plan_without_versions_is_an_error(tmp_path):
    model = make_model(tmp_path, "empty", versions=())
    with pytest.raises(RepositoryError, match="at least one version must be available"):
        plan_model(ModelSource("empty", model))


def test_plan_warns_about_missing_specific_version(tmp_path):
    model = make_model(tmp_path, "m", config=IDENTITY + "version_policy { specific "
                                                        "{ versions: [ 1, 2 ] } }")
    plan = plan_model(ModelSource("m", model))
    assert plan.versions == [1]
    assert plan.warnings == ["version 2 is specified for model 'm', but the version "
                             "directory is not present"]


def test_plan_of_missing_directory(tmp_path):
    with pytest.raises(RepositoryError, match="does not exist"):
        plan_model(ModelSource("gone", tmp_path / "gone"))
