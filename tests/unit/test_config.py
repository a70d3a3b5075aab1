"""Tests for scheduler.repository.config: parsing, Triton's defaults, validation and the JSON form."""

import json

import pytest
from google.protobuf import json_format
from tritonclient.grpc.model_config_pb2 import ModelConfig, ModelInstanceGroup

from scheduler.repository.config import (
    ConfigError,
    config_to_json,
    load_config,
    model_filename,
    normalize,
    parse_config,
    validate,
)

KIND = ModelInstanceGroup.Kind

PYTHON_MODEL = """
name: "m"
backend: "python"
max_batch_size: 64
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1, 4 ] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1, 4 ] }]
"""


def parse(text: str) -> ModelConfig:
    return parse_config(text, "test/config.pbtxt")


def ready(text: str, **kwargs) -> ModelConfig:
    """Parse and normalize, as the repository does before validating."""
    return normalize(parse(text), **kwargs)


def rejects(text: str, reason: str, **kwargs) -> None:
    with pytest.raises(ConfigError) as info:
        validate(ready(text, **kwargs))
    assert reason in str(info.value)


# --- parse_config / load_config ---------------------------------------------------


def test_parse_reads_text_format():
    config = parse(PYTHON_MODEL)
    assert config.name == "m"
    assert config.max_batch_size == 64
    assert list(config.input[0].dims) == [-1, 4]


def test_parse_error_names_file_position_and_reason():
    with pytest.raises(ConfigError) as info:
        parse_config('name: "m"\ninput [{ name: "A" data_type: TYPE_FOO }]', "/r/m/config.pbtxt")
    message = str(info.value)
    assert "/r/m/config.pbtxt" in message
    assert "line 2" in message
    assert "TYPE_FOO" in message


def test_parse_rejects_unknown_field():
    with pytest.raises(ConfigError, match="no field named \"max_batch\""):
        parse('max_batch: 4')


def test_negative_queue_delay_cannot_be_parsed():
    # max_queue_delay_microseconds is a uint64: a negative value is a parse error.
    with pytest.raises(ConfigError, match="out of range"):
        parse("dynamic_batching { max_queue_delay_microseconds: -1 }")


def test_enum_number_out_of_int32_range_is_a_config_error():
    # found by the property tests' fuzz profile: text_format raises ValueError here
    with pytest.raises(ConfigError, match="out of range"):
        parse('input [ { name: "I" data_type: 2147483648 dims: [ 1 ] } ]')


def test_load_config_without_file_is_empty_but_named(tmp_path):
    model = tmp_path / "simple"
    model.mkdir()
    config = load_config(model)
    assert config.name == "simple"
    expected = ModelConfig(name="simple")
    assert config == expected


def test_load_config_defaults_name_to_directory(tmp_path):
    model = tmp_path / "add_sub"
    model.mkdir()
    (model / "config.pbtxt").write_text('backend: "python"')
    config = load_config(model)
    assert config.name == "add_sub"
    assert config.backend == "python"


def test_load_config_rejects_name_other_than_directory(tmp_path):
    model = tmp_path / "dir_name"
    model.mkdir()
    (model / "config.pbtxt").write_text('name: "other" backend: "python"')
    with pytest.raises(ConfigError, match="unexpected directory name 'dir_name' for model "
                                          "'other', directory name must equal model name"):
        load_config(model)


def test_load_config_parse_error_names_the_file(tmp_path):
    model = tmp_path / "bad"
    model.mkdir()
    (model / "config.pbtxt").write_text("max_batch_size: many")
    with pytest.raises(ConfigError, match=str(model / "config.pbtxt")):
        load_config(model)


def test_load_config_rejects_undecodable_file(tmp_path):
    model = tmp_path / "binary"
    model.mkdir()
    (model / "config.pbtxt").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="failed to read"):
        load_config(model)


# --- normalize ----------------------------------------------------------------------


def test_normalize_returns_new_message_and_leaves_input_alone():
    config = parse(PYTHON_MODEL)
    before = config.SerializeToString()
    out = normalize(config)
    assert out is not config
    assert config.SerializeToString() == before
    assert not config.HasField("version_policy")
    assert out.HasField("version_policy")


def test_normalize_is_idempotent():
    once = ready(PYTHON_MODEL + "dynamic_batching {}")
    assert normalize(once) == once


def test_default_version_policy_is_latest_one():
    assert ready(PYTHON_MODEL).version_policy.latest.num_versions == 1


def test_explicit_version_policy_is_kept():
    out = ready(PYTHON_MODEL + "version_policy { all {} }")
    assert out.version_policy.HasField("all")
    assert not out.version_policy.HasField("latest")


def test_onnx_platform_gets_backend_and_filename():
    out = ready('name: "m" platform: "onnxruntime_onnx"')
    assert out.backend == "onnxruntime"
    assert out.platform == "onnxruntime_onnx"
    assert out.default_model_filename == "model.onnx"


def test_onnx_backend_gets_platform():
    out = ready('name: "m" backend: "onnxruntime"')
    assert out.platform == "onnxruntime_onnx"
    assert out.default_model_filename == "model.onnx"


def test_pytorch_platform_gets_backend_but_no_filename():
    # Triton's quirk: a config that names the platform keeps an empty filename.
    out = ready('name: "m" platform: "pytorch_libtorch"')
    assert out.backend == "pytorch"
    assert out.default_model_filename == ""
    assert model_filename(out) == "model.pt"


def test_pytorch_backend_gets_platform_and_filename():
    out = ready('name: "m" backend: "pytorch"')
    assert out.platform == "pytorch_libtorch"
    assert out.default_model_filename == "model.pt"


def test_python_backend_gets_filename_and_no_platform():
    out = ready('name: "m" backend: "python"')
    assert out.default_model_filename == "model.py"
    assert out.platform == ""


def test_explicit_filename_is_kept():
    out = ready('name: "m" backend: "python" default_model_filename: "entry.py"')
    assert out.default_model_filename == "entry.py"
    assert model_filename(out) == "entry.py"


def test_ensemble_keeps_platform_only_and_gets_no_groups_or_optimization():
    out = ready('name: "e" platform: "ensemble" ensemble_scheduling { step [{ model_name: "a" '
                'model_version: -1 input_map { key: "X" value: "IN" } '
                'output_map { key: "Y" value: "OUT" } }] }')
    assert out.platform == "ensemble"
    assert out.backend == ""
    assert len(out.instance_group) == 0
    assert not out.HasField("optimization")
    assert out.version_policy.latest.num_versions == 1


@pytest.mark.parametrize("files, backend, platform, filename", [
    (["model.onnx"], "onnxruntime", "onnxruntime_onnx", "model.onnx"),
    (["model.py", "helper.py"], "python", "", "model.py"),
    # Triton sets the platform with the backend here, so the filename stays empty.
    (["model.pt"], "pytorch", "pytorch_libtorch", ""),
])
def test_bare_config_backend_comes_from_version_files(files, backend, platform, filename):
    out = normalize(ModelConfig(name="m"), model_files=files)
    assert (out.backend, out.platform, out.default_model_filename) == (backend, platform, filename)


def test_files_do_not_override_a_given_platform():
    out = normalize(parse('name: "m" platform: "onnxruntime_onnx"'), model_files=["model.py"])
    assert out.backend == "onnxruntime"


def test_custom_backend_from_model_name():
    out = normalize(ModelConfig(name="model.identity"), model_files=[])
    assert out.backend == "identity"
    assert out.default_model_filename == "model.identity"


def test_unknown_bare_model_has_no_backend_and_is_rejected():
    out = normalize(ModelConfig(name="mystery"), model_files=["weights.bin"])
    assert out.backend == ""
    with pytest.raises(ConfigError, match="must specify 'platform' or 'backend' for 'mystery'"):
        validate(out)


def test_dynamic_batching_preferred_defaults_to_max_batch_size():
    out = ready(PYTHON_MODEL + "dynamic_batching {}")
    assert list(out.dynamic_batching.preferred_batch_size) == [64]


def test_dynamic_batching_given_preferred_sizes_are_kept():
    out = ready(PYTHON_MODEL + "dynamic_batching { preferred_batch_size: [ 4, 8 ] }")
    assert list(out.dynamic_batching.preferred_batch_size) == [4, 8]


def test_dynamic_batching_without_batch_dimension_gets_no_preferred_size():
    out = ready(PYTHON_MODEL.replace("max_batch_size: 64", "max_batch_size: 0")
                + "dynamic_batching {}")
    assert list(out.dynamic_batching.preferred_batch_size) == []


def test_no_dynamic_batching_is_not_added():
    assert not ready(PYTHON_MODEL).HasField("dynamic_batching")


def test_sequence_batching_defaults():
    out = ready(PYTHON_MODEL + "sequence_batching { oldest { max_candidate_sequences: 4 } }")
    assert out.sequence_batching.max_sequence_idle_microseconds == 1_000_000
    assert list(out.sequence_batching.oldest.preferred_batch_size) == [64]


def test_sequence_batching_given_idle_is_kept():
    out = ready(PYTHON_MODEL + "sequence_batching { max_sequence_idle_microseconds: 5 }")
    assert out.sequence_batching.max_sequence_idle_microseconds == 5


def test_missing_instance_group_becomes_one_named_after_model():
    out = ready(PYTHON_MODEL)
    assert len(out.instance_group) == 1
    group = out.instance_group[0]
    # Triton names the group it adds "<model>", not "<model>_0".
    assert (group.name, group.count, group.kind) == ("m", 1, KIND.KIND_CPU)
    assert list(group.gpus) == []


def test_groups_are_named_by_index_and_counted():
    out = ready(PYTHON_MODEL + "instance_group [{ kind: KIND_CPU }, "
                               "{ name: \"mine\" count: 3 kind: KIND_CPU }, "
                               "{ kind: KIND_CPU count: -2 }]")
    assert [g.name for g in out.instance_group] == ["m_0", "mine", "m_2"]
    # Triton replaces any count below 1 with the default.
    assert [g.count for g in out.instance_group] == [1, 3, 1]


def test_onnxruntime_cpu_groups_default_to_two_instances():
    out = ready('name: "m" backend: "onnxruntime" instance_group [{ kind: KIND_CPU }]')
    assert out.instance_group[0].count == 2


def test_onnxruntime_gpu_groups_default_to_one_instance():
    out = ready('name: "m" backend: "onnxruntime" instance_group [{ kind: KIND_GPU }]',
                has_gpu=True)
    assert out.instance_group[0].count == 1


def test_kind_auto_without_gpu_is_cpu():
    out = ready('name: "m" backend: "onnxruntime" instance_group [{ count: 1 }]')
    assert out.instance_group[0].kind == KIND.KIND_CPU
    assert list(out.instance_group[0].gpus) == []


def test_kind_auto_with_gpu_is_gpu_with_all_gpus():
    out = ready('name: "m" backend: "onnxruntime" instance_group [{ count: 1 }]',
                has_gpu=True, gpu_ids=[0, 1])
    assert out.instance_group[0].kind == KIND.KIND_GPU
    assert list(out.instance_group[0].gpus) == [0, 1]


def test_kind_auto_with_gpu_defaults_to_gpu_zero():
    out = ready('name: "m" backend: "pytorch"', has_gpu=True)
    assert out.instance_group[0].kind == KIND.KIND_GPU
    assert list(out.instance_group[0].gpus) == [0]


def test_python_kind_auto_follows_gpu_availability():
    # The python backend prefers KIND_GPU when the machine has GPUs, as in Triton.
    assert ready(PYTHON_MODEL).instance_group[0].kind == KIND.KIND_CPU
    assert ready(PYTHON_MODEL, has_gpu=True).instance_group[0].kind == KIND.KIND_GPU


def test_kind_auto_naming_missing_gpu_is_cpu():
    out = ready('name: "m" backend: "onnxruntime" instance_group [{ gpus: [ 3 ] }]',
                has_gpu=True, gpu_ids=[0])
    assert out.instance_group[0].kind == KIND.KIND_CPU


def test_explicit_gpus_are_kept():
    out = ready('name: "m" backend: "onnxruntime" instance_group [{ kind: KIND_GPU gpus: [1] }]',
                has_gpu=True, gpu_ids=[0, 1])
    assert list(out.instance_group[0].gpus) == [1]


def test_optimization_pinned_memory_defaults_on():
    out = ready(PYTHON_MODEL)
    assert out.optimization.input_pinned_memory.enable is True
    assert out.optimization.output_pinned_memory.enable is True


def test_optimization_explicit_pinned_memory_is_kept():
    out = ready(PYTHON_MODEL + "optimization { input_pinned_memory { enable: false } }")
    assert out.optimization.input_pinned_memory.enable is False
    assert out.optimization.output_pinned_memory.enable is True


def test_transaction_policy_is_not_added_but_kept():
    assert not ready(PYTHON_MODEL).HasField("model_transaction_policy")
    out = ready(PYTHON_MODEL + "model_transaction_policy { decoupled: true }")
    assert out.model_transaction_policy.decoupled is True


# --- validate -----------------------------------------------------------------------


def test_valid_python_model_passes():
    validate(ready(PYTHON_MODEL + "dynamic_batching {}"))


def test_missing_backend_and_platform():
    rejects('name: "m"', "must specify 'platform' or 'backend' for 'm'")


def test_unknown_platform_without_backend():
    rejects('name: "m" platform: "caffe2_netdef"', "unexpected platform type 'caffe2_netdef'")


def test_ensemble_with_backend():
    rejects('name: "m" platform: "ensemble" backend: "python"',
            "must have platform type 'ensemble' and empty backend type")


def test_platform_backend_mismatch():
    rejects('name: "m" platform: "pytorch_libtorch" backend: "onnxruntime"',
            "unexpected 'platform' and 'backend' pair")


def test_unknown_data_type():
    rejects('name: "m" backend: "python" input [{ name: "INPUT0" data_type: 99 dims: [1] }]',
            "model 'm': input 'INPUT0' has unknown data type 99")


def test_missing_data_type():
    rejects('name: "m" backend: "python" output [{ name: "OUT" dims: [1] }]',
            "model output 'OUT' must specify 'data_type' for m")


def test_input_without_name():
    rejects('name: "m" backend: "python" input [{ data_type: TYPE_FP32 dims: [1] }]',
            "model input must specify 'name'")


@pytest.mark.parametrize("kind", ["input", "output"])
def test_duplicate_tensor_names(kind):
    tensor = '{ name: "T" data_type: TYPE_FP32 dims: [1] }'
    rejects(f'name: "m" backend: "python" {kind} [{tensor}, {tensor}]',
            f"model {kind} 'T' is specified more than once for m")


@pytest.mark.parametrize("dims", ["[ 0 ]", "[ 2, -2 ]", "[ -5 ]"])
def test_bad_dims(dims):
    rejects(f'name: "m" backend: "python" '
            f'input [{{ name: "A" data_type: TYPE_FP32 dims: {dims} }}]',
            "model input 'A' dimension must be integer >= 1, or -1")


def test_empty_dims():
    rejects('name: "m" backend: "python" input [{ name: "A" data_type: TYPE_FP32 }]',
            "model input 'A' must specify 'dims'")


def test_variable_dims_pass():
    validate(ready('name: "m" backend: "python" input [{ name: "A" data_type: TYPE_STRING '
                   'dims: [ -1, -1 ] }]'))


def test_reshape_rules():
    base = 'name: "m" backend: "python" max_batch_size: {mbs} input [{{ name: "A" ' \
           'data_type: TYPE_FP32 dims: {dims} reshape: {{ shape: {shape} }} }}]'
    validate(ready(base.format(mbs=8, dims="[1]", shape="[ ]")))
    validate(ready(base.format(mbs=0, dims="[2, 3]", shape="[6]")))
    validate(ready(base.format(mbs=0, dims="[2, 4, -1, 6]", shape="[8, -1, 1, 6]")))
    rejects(base.format(mbs=0, dims="[1]", shape="[ ]"), "cannot have empty reshape")
    rejects(base.format(mbs=0, dims="[2, 3]", shape="[5]"), "different size for dims and reshape")
    rejects(base.format(mbs=0, dims="[2, -1]", shape="[2, -1, -1]"),
            "different number of variable-size dimensions")
    rejects(base.format(mbs=0, dims="[2]", shape="[0]"), "reshape dimensions must be integer")


def test_nchw_needs_three_dims():
    rejects('name: "m" backend: "python" input [{ name: "A" data_type: TYPE_FP32 '
            'format: FORMAT_NCHW dims: [3, 4] }]', "NHWC/NCHW require 3 dims")


def test_negative_max_batch_size():
    rejects(PYTHON_MODEL.replace("max_batch_size: 64", "max_batch_size: -1"),
            "'max_batch_size' must be non-negative value for m")


@pytest.mark.parametrize("size, reason", [
    (0, "dynamic batching preferred size must be positive for m"),
    (-3, "dynamic batching preferred size must be positive for m"),
    (65, "dynamic batching preferred size must be <= max batch size for m"),
])
def test_bad_preferred_batch_size(size, reason):
    rejects(PYTHON_MODEL + f"dynamic_batching {{ preferred_batch_size: [ 4, {size} ] }}", reason)


def test_batchers_are_accepted_without_batch_dimension():
    # Triton runs a dynamic or sequence batcher on a max_batch_size 0 model with
    # batches of one request; it does not reject the config.
    nobatch = PYTHON_MODEL.replace("max_batch_size: 64", "max_batch_size: 0") \
        .replace("[ -1, 4 ]", "[ 4 ]")
    validate(ready(nobatch + "dynamic_batching { max_queue_delay_microseconds: 100 }"))
    validate(ready(nobatch + "sequence_batching {}"))
    rejects(nobatch + "dynamic_batching { preferred_batch_size: [ 1 ] }",
            "preferred size must be <= max batch size")


def test_priority_levels():
    rejects(PYTHON_MODEL + "dynamic_batching { priority_levels: 2 default_priority_level: 3 }",
            "default priority level must be in range [1, 2] for m")
    rejects(PYTHON_MODEL + "dynamic_batching { priority_levels: 2 default_priority_level: 1 "
                           "priority_queue_policy { key: 5 value: {} } }",
            "priority queue policy must have priority level in range [1, 2]")
    validate(ready(PYTHON_MODEL + "dynamic_batching { priority_levels: 2 "
                                  "default_priority_level: 2 }"))


def test_preserve_ordering_conflicts():
    rejects(PYTHON_MODEL + "dynamic_batching { preserve_ordering: true priority_levels: 2 "
                           "default_priority_level: 1 }", "Only one priority level")
    rejects(PYTHON_MODEL + "dynamic_batching { preserve_ordering: true default_queue_policy { "
                           "timeout_action: DELAY default_timeout_microseconds: 10 } }",
            "can not have DELAY as timeout action")


def sequence(controls: str) -> str:
    return PYTHON_MODEL + f"sequence_batching {{ control_input [ {controls} ] }}"


def test_sequence_controls_valid():
    validate(ready(sequence(
        '{ name: "START" control [{ kind: CONTROL_SEQUENCE_START fp32_false_true: [0, 1] }] },'
        '{ name: "CORRID" control [{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }] }')))


def test_sequence_control_needs_values():
    rejects(sequence('{ name: "S" control [{ kind: CONTROL_SEQUENCE_START }] }'),
            "must specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' "
            "for CONTROL_SEQUENCE_START for m")
    rejects(sequence('{ name: "S" control [{ kind: CONTROL_SEQUENCE_END '
                                     'int32_false_true: [0, 1, 1] }] }'),
            "'int32_false_true' must have exactly 2 entries")


def test_sequence_control_kind_once_and_tensor_once():
    rejects(sequence(
        '{ name: "A" control [{ kind: CONTROL_SEQUENCE_READY int32_false_true: [0, 1] }] },'
        '{ name: "B" control [{ kind: CONTROL_SEQUENCE_READY int32_false_true: [0, 1] }] }'),
        "specifies multiple CONTROL_SEQUENCE_READY tensors")
    rejects(sequence(
        '{ name: "A" control [{ kind: CONTROL_SEQUENCE_READY int32_false_true: [0, 1] }] },'
        '{ name: "A" control [{ kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] }] }'),
        "control tensor 'A' is specified for multiple control kinds")


def test_sequence_corrid_type():
    rejects(sequence(
        '{ name: "C" control [{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 }] }'),
        "unexpected data type for control CONTROL_SEQUENCE_CORRID for m")


def test_sequence_oldest_preferred_size():
    rejects(PYTHON_MODEL + "sequence_batching { oldest { preferred_batch_size: [ 128 ] } }",
            "sequence batching preferred batch size must be <= max batch size for m")


def test_response_cache_with_decoupled():
    rejects(PYTHON_MODEL + "model_transaction_policy { decoupled: true } "
                           "response_cache { enable: true }", "'decoupled' transaction policy")


def test_negative_instance_count_is_rejected_before_normalizing():
    raw = parse(PYTHON_MODEL + "instance_group [{ name: \"g\" kind: KIND_CPU count: -1 }] "
                               "version_policy { latest { num_versions: 1 } }")
    with pytest.raises(ConfigError, match="instance group g of model m must have a count"):
        validate(raw)
    validate(normalize(raw))


def test_unnormalized_config_lacks_version_policy():
    with pytest.raises(ConfigError, match="must specify 'version policy' for m"):
        validate(parse(PYTHON_MODEL))


def test_gpu_group_without_gpus():
    rejects(PYTHON_MODEL + "instance_group [{ kind: KIND_GPU }]",
            "instance group m_0 of model m has kind KIND_GPU but no GPUs are available")


def test_cpu_group_with_gpus():
    rejects(PYTHON_MODEL + "instance_group [{ kind: KIND_CPU gpus: [0] }]",
            "has kind KIND_CPU but specifies one or more GPUs")


def test_gpu_group_naming_missing_gpu():
    config = ready(PYTHON_MODEL + "instance_group [{ kind: KIND_GPU gpus: [2] }]", has_gpu=True)
    with pytest.raises(ConfigError, match="specifies invalid or unsupported gpu id 2"):
        validate(config, gpu_ids=[0, 1])
    validate(config, gpu_ids=[0, 1, 2])


ENSEMBLE = ('name: "e" platform: "ensemble" input [{ name: "IN" data_type: TYPE_FP32 dims: [1] }] '
            'output [{ name: "OUT" data_type: TYPE_FP32 dims: [1] }] ')


def test_ensemble_rules():
    step = ('step [{ model_name: "a" model_version: -1 input_map { key: "X" value: "IN" } '
            'output_map { key: "Y" value: "OUT" } }]')
    validate(ready(ENSEMBLE + f"ensemble_scheduling {{ {step} }}"))
    rejects(ENSEMBLE, "ensemble scheduling must be set for ensemble e")
    rejects(ENSEMBLE + "ensemble_scheduling {}", "must specify 'step' for ensemble 'e'")
    rejects(ENSEMBLE + 'ensemble_scheduling { step [{ input_map { key: "X" value: "IN" } }] }',
            "must specify 'model_name' in step 0 of ensemble 'e'")
    rejects(ENSEMBLE + f"ensemble_scheduling {{ {step} }} instance_group [{{ count: 1 }}]",
            "instance group should not be specified for ensemble 'e'")


# --- config_to_json -----------------------------------------------------------------


def test_json_of_normalized_python_model_matches_triton():
    config = ready(PYTHON_MODEL + "dynamic_batching { max_queue_delay_microseconds: 100 } "
                                 "instance_group [{ kind: KIND_CPU }]")
    obj = config_to_json(config)
    assert obj["name"] == "m"
    assert obj["max_batch_size"] == 64 and type(obj["max_batch_size"]) is int
    assert obj["input"][0]["data_type"] == "TYPE_FP32"
    assert obj["input"][0]["dims"] == [-1, 4]
    assert all(type(d) is int for d in obj["input"][0]["dims"])
    assert obj["input"][0]["format"] == "FORMAT_NONE"
    assert obj["input"][0]["optional"] is False
    assert obj["instance_group"][0]["name"] == "m_0"
    assert obj["instance_group"][0]["kind"] == "KIND_CPU"
    assert obj["instance_group"][0]["count"] == 1
    assert obj["instance_group"][0]["gpus"] == []
    assert obj["dynamic_batching"]["preferred_batch_size"] == [64]
    assert obj["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert obj["dynamic_batching"]["priority_levels"] == 0
    assert obj["dynamic_batching"]["priority_queue_policy"] == {}
    assert obj["version_policy"] == {"latest": {"num_versions": 1}}
    assert obj["optimization"]["input_pinned_memory"] == {"enable": True}
    assert obj["optimization"]["priority"] == "PRIORITY_DEFAULT"
    assert obj["backend"] == "python" and obj["platform"] == ""
    assert obj["default_model_filename"] == "model.py"
    assert obj["output"][0]["label_filename"] == ""
    assert obj["parameters"] == {} and obj["model_warmup"] == []
    # Unset sub-messages are left out, as protobuf's JSON printer does for Triton.
    assert "sequence_batching" not in obj
    assert "model_transaction_policy" not in obj
    assert json.loads(json.dumps(obj)) == obj


def test_json_int64_fields_are_numbers_everywhere():
    config = ready(
        'name: "m" backend: "python" max_batch_size: 4 '
        'version_policy { specific { versions: [ 1, 3 ] } } '
        'input [{ name: "A" data_type: TYPE_INT64 dims: [ 2 ] reshape { shape: [ 1, 2 ] } }] '
        'dynamic_batching { priority_levels: 2 default_priority_level: 1 '
        '  default_queue_policy { default_timeout_microseconds: 7 } '
        '  priority_queue_policy { key: 2 value { default_timeout_microseconds: 9 } } } '
        'model_warmup [{ name: "w" batch_size: 1 '
        '  inputs { key: "A" value { data_type: TYPE_INT64 dims: [ 2 ] zero_data: true } } }] '
        'parameters { key: "p" value { string_value: "1" } }')
    obj = config_to_json(config)
    assert obj["version_policy"]["specific"]["versions"] == [1, 3]
    assert obj["input"][0]["reshape"]["shape"] == [1, 2]
    batching = obj["dynamic_batching"]
    assert batching["priority_levels"] == 2 and batching["default_priority_level"] == 1
    assert batching["default_queue_policy"]["default_timeout_microseconds"] == 7
    # Map keys stay strings (JSON has no other kind); values are fixed.
    assert batching["priority_queue_policy"]["2"]["default_timeout_microseconds"] == 9
    assert obj["model_warmup"][0]["inputs"]["A"]["dims"] == [2]
    assert obj["parameters"] == {"p": {"string_value": "1"}}


def test_json_sequence_and_ensemble_int64_fields():
    seq = config_to_json(ready(PYTHON_MODEL + "sequence_batching { direct { "
                                              "max_queue_delay_microseconds: 5 } }"))
    assert seq["sequence_batching"]["max_sequence_idle_microseconds"] == 1_000_000
    assert seq["sequence_batching"]["direct"]["max_queue_delay_microseconds"] == 5
    ens = config_to_json(ready(ENSEMBLE + 'ensemble_scheduling { step [{ model_name: "a" '
                                          'model_version: -1 input_map { key: "X" value: "IN" } '
                                          'output_map { key: "Y" value: "OUT" } }] }'))
    assert ens["ensemble_scheduling"]["step"][0]["model_version"] == -1
    assert ens["instance_group"] == []
    assert "optimization" not in ens


def test_json_parses_back_to_the_same_config():
    config = ready(PYTHON_MODEL + "dynamic_batching {} instance_group [{ kind: KIND_CPU }]")
    again = json_format.ParseDict(config_to_json(config), ModelConfig())
    assert again == config


# --- batch_input / batch_output (ragged batching) ----------------------------------

RAGGED_MODEL = """
name: "m"
backend: "onnxruntime"
max_batch_size: 8
input [{ name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }]
output [{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }]
"""


def test_batch_io_survives_normalization_and_the_config_json():
    """batch_input and batch_output are kept as given and printed by the config
    endpoint with Triton's field names and enum names."""
    text = RAGGED_MODEL + """
    batch_input [{ kind: BATCH_ITEM_SHAPE_FLATTEN target_name: [ "S", "S2" ]
                   data_type: TYPE_FP32 source_input: "INPUT" }]
    batch_output [{ target_name: "OUT" kind: BATCH_SCATTER_WITH_INPUT_SHAPE
                    source_input: "INPUT" }]
    """
    config = ready(text)
    validate(config)
    out = json.loads(json.dumps(config_to_json(config)))
    assert out["input"][0]["allow_ragged_batch"] is True
    assert out["batch_input"] == [{"kind": "BATCH_ITEM_SHAPE_FLATTEN",
                                   "target_name": ["S", "S2"], "data_type": "TYPE_FP32",
                                   "source_input": ["INPUT"]}]
    assert out["batch_output"] == [{"target_name": ["OUT"],
                                    "kind": "BATCH_SCATTER_WITH_INPUT_SHAPE",
                                    "source_input": ["INPUT"]}]
    # kind 0 is printed too (the proto's default, BATCH_ELEMENT_COUNT)
    config = ready(RAGGED_MODEL + """batch_input [{ target_name: "N" data_type: TYPE_INT32
                                                  source_input: "INPUT" }]""")
    assert config_to_json(config)["batch_input"][0]["kind"] == "BATCH_ELEMENT_COUNT"


@pytest.mark.parametrize("extra, reason", [
    ('batch_input [{ kind: BATCH_ELEMENT_COUNT target_name: "N" data_type: TYPE_INT32 }]',
     "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 0 for m"),
    ('batch_input [{ kind: BATCH_ITEM_SHAPE target_name: "N" data_type: TYPE_INT32 '
     'source_input: [ "INPUT", "INPUT" ] }]',
     "batch input kind 'BATCH_ITEM_SHAPE' expects 1 source input, got 2"),
    ('batch_input [{ target_name: "N" data_type: TYPE_INT64 source_input: "INPUT" }]',
     "batch input data type must be TYPE_INT32 or TYPE_FP32 for m"),
    ('batch_input [{ target_name: "N" source_input: "INPUT" }]',
     "batch input data type must be TYPE_INT32 or TYPE_FP32"),
    ('batch_input [{ target_name: "N" data_type: TYPE_INT32 source_input: "NOPE" }]',
     "unknown source input name 'NOPE' for m"),
    ('batch_input [{ target_name: "INPUT" data_type: TYPE_INT32 source_input: "INPUT" }]',
     "batch input target 'INPUT' is also a model input"),
    ('batch_output [{ target_name: "OUT" source_input: "NOPE" }]',
     "unknown source input name 'NOPE'"),
    ('batch_output [{ target_name: "OUT" }]',
     "batch output kind 'BATCH_SCATTER_WITH_INPUT_SHAPE' expects 1 source input, got 0"),
    ('batch_output [{ target_name: "NOPE" source_input: "INPUT" }]',
     "unknown target output name 'NOPE' for m"),
    ('batch_output [{ target_name: [ "OUT", "OUT" ] source_input: "INPUT" }]',
     "target output name 'OUT' can only be specified once"),
])
def test_bad_batch_io_is_rejected_with_tritons_reason(extra, reason):
    """Triton's ValidateBatchIO load errors."""
    rejects(RAGGED_MODEL + extra, reason)


def test_batch_io_names_wait_for_auto_complete():
    """A config that leaves inputs and outputs to auto-complete is not refused for
    naming them in batch_input/batch_output: it is validated again once completed."""
    validate(ready("""name: "m" backend: "onnxruntime"
        batch_input [{ target_name: "N" data_type: TYPE_INT32 source_input: "INPUT" }]
        batch_output [{ target_name: "OUT" source_input: "INPUT" }]"""))


@pytest.mark.parametrize("field,reason", [
    ("instance_group { kind: 9 }", "instance group m_0 of model m has unexpected kind 9"),
    ('sequence_batching { control_input { name: "S" control { kind: 7 } } }',
     "sequence batching control tensor 'S' has unexpected kind 7 for m"),
    ('batch_input { kind: 9 target_name: "T" data_type: TYPE_FP32 source_input: "X" }',
     "unknown batch input kind 9 for m"),
    ('batch_output { kind: 9 target_name: "Y" source_input: "X" }',
     "unknown batch output kind 9 for m"),
])
def test_enum_numbers_no_kind_has_are_refused(field, reason):
    """Text format takes any number for a proto3 enum; Kind.Name of one raised
    ValueError out of the loader (found by tests/unit/test_properties_config.py)."""
    rejects('name: "m" backend: "python" max_batch_size: 4 '
            'input [{name: "X" data_type: TYPE_FP32 dims: [1]}] '
            'output [{name: "Y" data_type: TYPE_FP32 dims: [1]}] ' + field, reason)
