"""Property-based tests (Hypothesis) of the model configuration loader
(scheduler/repository/config.py: load_config, parse_config, normalize, validate, config_to_json;
scheduler/repository/disk.py: parse_override), run in the order a load runs them.

Arbitrary text, and the repository's own configs (tests/ and examples/) with fields
dropped, duplicated or changed (bad dims, negative max_batch_size, unknown datatypes,
bad batcher and instance-group values), are either loaded or refused with ConfigError
and a message; nothing else escapes and nothing hangs (the suite's timeout). A config
that loads normalizes idempotently and prints as JSON.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

from google.protobuf import text_format
from hypothesis import given, note, settings
from hypothesis import strategies as st
from tritonclient.grpc.model_config_pb2 import DataType, ModelConfig, ModelInstanceGroup

from scheduler.repository import config as cfg
from scheduler.repository.disk import parse_override

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(p for top in ("tests", "examples")
                 for p in (ROOT / top).rglob("config.pbtxt") if ".venv" not in p.parts)
TEXTS = [(p.parent.name, p.read_text()) for p in SOURCES]
ANY_TEXT = st.sampled_from(TEXTS)  # made once, not at every draw
HUGE = [2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**31), -(2**63), -1, 0]


def load(text: str, name: str, has_gpu: bool = False):
    """What a load does with a config text: the normalized, validated config, or the
    ConfigError it is refused with. Any other exception fails the test."""
    try:
        config = cfg.parse_config(text, f"{name}/config.pbtxt")
        if not config.name:
            config.name = name
        return check(config, has_gpu)
    except cfg.ConfigError as e:
        assert str(e), "a ConfigError without a message"
        return e


def check(config: ModelConfig, has_gpu: bool = False):
    gpu_ids = [0] if has_gpu else []
    config = cfg.normalize(config, has_gpu=has_gpu, gpu_ids=gpu_ids,
                           model_files={cfg.model_filename(config) or "model.py"})
    cfg.validate(config, gpu_ids=gpu_ids)
    # a config that loads normalizes idempotently, validates again and prints
    again = cfg.normalize(config, has_gpu=has_gpu, gpu_ids=gpu_ids)
    assert again == config, text_format.MessageToString(again)
    cfg.validate(again, gpu_ids=gpu_ids)
    json.dumps(cfg.config_to_json(config))
    return config


def outcome(fn, *args):
    try:
        return fn(*args)
    except cfg.ConfigError as e:
        assert str(e)
        return e


# ---------------------------------------------------------------------- strategies

_NUMBER = re.compile(r"(?<![\w.])-?\d+(?![\w.])")
_ENUM = re.compile(r"\b(TYPE|KIND)_[A-Z0-9_]+\b")
_STRING = re.compile(r'"[^"\n]*"')


# Built once (a strategy made inside a composite is made and validated at every draw).
_ONE_TO_THREE = st.integers(1, 3)
_EDITS = st.sampled_from(["drop", "dup", "number", "enum", "string", "cut", "insert"])
_TOKENS = {"number": st.integers(-(2**65), 2**65).map(str) | st.sampled_from(HUGE).map(str),
           "enum": st.sampled_from(["TYPE_FOO", "KIND_MODEL", "TYPE_BF16", "KIND_AUTO", "7",
                                    "-1", "TYPE_INVALID"]),
           "string": st.sampled_from(['""', '"x"', '"../.."', '"a\\0b"', '"ensemble"',
                                      '"python"', '"model.py"', '"\\xff"'])}
_LINE = st.text(max_size=12)


@st.composite
def mutated_text(draw):
    """A real config's text with one to three edits of its lines and tokens."""
    name, text = draw(ANY_TEXT)
    for _ in range(draw(_ONE_TO_THREE)):
        lines = text.split("\n")
        how = draw(_EDITS)
        note(f"edit: {how}")
        k = draw(st.integers(0, len(lines) - 1))
        if how == "drop":
            del lines[k]
        elif how == "dup":
            lines.insert(k, lines[k])
        elif how in ("number", "enum", "string"):
            pattern = {"number": _NUMBER, "enum": _ENUM, "string": _STRING}[how]
            spots = [m for m in pattern.finditer(text)]
            if spots:
                m = draw(st.sampled_from(spots))
                text = text[:m.start()] + draw(_TOKENS[how]) + text[m.end():]
                continue
        elif how == "cut":
            text = text[:draw(st.integers(0, len(text)))]
            continue
        else:
            lines.insert(k, draw(_LINE))
        text = "\n".join(lines)
    return name, text


_DIMS = st.lists(st.integers(-3, 5) | st.sampled_from(
    [h for h in HUGE if -(2**63) <= h < 2**63]), max_size=4)


def _dims(draw):
    return draw(_DIMS)


_PARSED: dict = {}


def _parsed(name: str, text: str) -> ModelConfig:
    """A repository config parsed once per session (an empty config where it does not
    parse): a copy of it is what each example edits, instead of parsing the text anew
    (two thirds of the strategy's cost)."""
    key = (name, text)
    if key not in _PARSED:
        try:
            _PARSED[key] = cfg.parse_config(text, name)
        except cfg.ConfigError:
            _PARSED[key] = ModelConfig()
    return _PARSED[key]


_INT64 = st.integers(-(2**63), 2**63 - 1)
_UINT64 = st.integers(0, 2**64 - 1)
_INT32 = st.integers(-(2**31), 2**31 - 1)
_CHANGES = st.sampled_from([
    "max_batch_size", "dims", "data_type", "reshape", "io_dup", "preferred",
    "queue", "priority", "instance", "sequence", "platform", "version_policy",
    "ensemble"])
_IO_DTYPES = st.sampled_from(list(DataType.values()) + [-1, 99, 2**30])
_CONTROL_DTYPES = st.sampled_from(list(DataType.values()) + [99])
_KINDS = st.sampled_from(list(ModelInstanceGroup.Kind.values()) + [9])
_CLAMPED_INT64S = st.lists(_INT64.map(lambda v: max(min(v, 2**31 - 1), -(2**31))),
                           max_size=2)
_CONTROL_NAMES = st.sampled_from(["", "START", "X"])
_PLATFORMS = st.sampled_from(["", "ensemble", "onnxruntime_onnx", "pytorch_libtorch",
                              "tensorrt_plan", "nope"])
_BACKENDS = st.sampled_from(["", "python", "onnxruntime", "pytorch", "nope"])
_VERSION_POLICIES = st.sampled_from(["latest", "specific", "all"])


@st.composite
def mutated_message(draw):
    """A real config parsed, with one to three fields set to values Triton refuses
    (or accepts at the edge)."""
    name, text = draw(ANY_TEXT)
    config = ModelConfig()
    config.CopyFrom(_parsed(name, text))
    config.name = config.name or name
    int64, uint64, int32 = _INT64, _UINT64, _INT32
    for _ in range(draw(_ONE_TO_THREE)):
        how = draw(_CHANGES)
        note(f"change: {how}")
        ios = list(config.input) + list(config.output)
        io = draw(st.sampled_from(ios)) if ios else config.input.add(name="X")
        if how == "max_batch_size":
            config.max_batch_size = draw(int32)
        elif how == "dims":
            del io.dims[:]
            io.dims.extend(_dims(draw))
        elif how == "data_type":
            io.data_type = draw(_IO_DTYPES)
        elif how == "reshape":
            io.reshape.shape.extend(_dims(draw))
        elif how == "io_dup":
            (config.input if io in config.input else config.output).add().CopyFrom(io)
        elif how == "preferred":
            config.dynamic_batching.preferred_batch_size.extend(
                draw(st.lists(int32, max_size=3)))
        elif how == "queue":
            db = config.dynamic_batching
            db.max_queue_delay_microseconds = draw(uint64)
            db.default_queue_policy.timeout_action = draw(st.integers(-1, 3))
            db.default_queue_policy.default_timeout_microseconds = draw(uint64)
            db.default_queue_policy.max_queue_size = draw(st.integers(0, 2**32 - 1))
            db.preserve_ordering = draw(st.booleans())
        elif how == "priority":
            db = config.dynamic_batching
            db.priority_levels = draw(uint64)
            db.default_priority_level = draw(uint64)
            for level in draw(st.lists(uint64, max_size=2)):
                db.priority_queue_policy[level].timeout_action = draw(st.integers(0, 2))
        elif how == "instance":
            group = config.instance_group.add(
                count=draw(int32), kind=draw(_KINDS))
            group.gpus.extend(draw(st.lists(int32, max_size=2)))
            group.profile.extend(draw(st.lists(st.text(max_size=3), max_size=1)))
        elif how == "sequence":
            seq = config.sequence_batching
            seq.max_sequence_idle_microseconds = draw(uint64)
            control = seq.control_input.add(name=draw(_CONTROL_NAMES))
            c = control.control.add(kind=draw(st.integers(-1, 5)))
            c.int32_false_true.extend(draw(st.lists(st.integers(-3, 3), max_size=3)))
            c.fp32_false_true.extend(draw(st.lists(st.floats(width=32), max_size=3)))
            c.data_type = draw(_CONTROL_DTYPES)
            if draw(st.booleans()):
                seq.oldest.max_candidate_sequences = draw(st.integers(-5, 5))
                seq.oldest.preferred_batch_size.extend(draw(_CLAMPED_INT64S))
        elif how == "platform":
            config.platform = draw(_PLATFORMS)
            config.backend = draw(_BACKENDS)
        elif how == "version_policy":
            which = draw(_VERSION_POLICIES)
            if which == "latest":
                config.version_policy.latest.num_versions = draw(st.integers(0, 2**32 - 1))
            elif which == "specific":
                config.version_policy.specific.versions.extend(
                    draw(st.lists(int64, max_size=3)))
            else:
                config.version_policy.all.SetInParent()
        else:
            step = config.ensemble_scheduling.step.add(
                model_name=draw(st.sampled_from(("", "a", config.name))),  # a tuple: cached
                model_version=draw(int64))
            step.input_map[draw(st.text(max_size=3))] = draw(st.text(max_size=3))
            step.output_map[draw(st.text(max_size=3))] = draw(st.text(max_size=3))
    return config


# ----------------------------------------------------------------------- properties


def test_the_repository_configs_load_and_normalize_idempotently():
    loaded = [load(text, name) for name, text in TEXTS]
    assert len(TEXTS) > 20
    assert sum(not isinstance(c, cfg.ConfigError) for c in loaded) > 20


@given(text=st.text(max_size=200) | st.binary(max_size=200).map(
    lambda b: b.decode("latin-1")), has_gpu=st.booleans())
def test_arbitrary_text_loads_or_is_refused_with_a_config_error(text, has_gpu):
    load(text, "m", has_gpu)


def test_edited_configs_load_or_are_refused_with_a_config_error():
    refusals = []

    @settings(max_examples=2 * settings.default.max_examples)
    @given(case=mutated_text(), has_gpu=st.booleans())
    def prop(case, has_gpu):
        name, text = case
        out = load(text, name, has_gpu)
        if isinstance(out, cfg.ConfigError):
            refusals.append(str(out))

    prop()
    assert any("failed to parse model configuration" in r for r in refusals)
    assert any("failed to parse" not in r for r in refusals), refusals[:20]


def test_changed_configs_load_or_are_refused_with_a_config_error():
    refusals = []
    loaded = []

    # the mutations reach every refusal checked below only in 300 examples or so
    @settings(max_examples=max(300, 2 * settings.default.max_examples))
    @given(config=mutated_message(), has_gpu=st.booleans())
    def prop(config, has_gpu):
        out = outcome(check, config, has_gpu)
        (refusals if isinstance(out, cfg.ConfigError) else loaded).append(str(out))
        # the same config as text goes the same way
        again = load(text_format.MessageToString(config), config.name, has_gpu)
        assert type(again) is type(out) and str(again) == str(out)

    prop()
    assert loaded
    for words in ("max_batch_size", "dimension must be integer", "data type",
                  "preferred size", "default priority level must be in range",
                  "priority queue policy must have priority level in range",
                  "instance group", "sequence batching", "ensemble"):
        assert any(words in r for r in refusals), (words, refusals[:30])


@given(text=st.text(max_size=80) | st.binary(max_size=80).map(lambda b: b.decode("latin-1"))
       | st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                      lambda c: st.lists(c, max_size=3) | st.dictionaries(
                          st.sampled_from(["name", "max_batch_size", "input", "dims",
                                           "data_type", "backend", "x"]), c, max_size=3),
                      max_leaves=8).map(json.dumps))
def test_load_api_config_overrides_load_or_are_refused(text):
    out = outcome(parse_override, text, "m")
    if not isinstance(out, cfg.ConfigError):
        outcome(check, out)


@settings(max_examples=25)
@given(data=st.binary(max_size=64), named=st.booleans())
def test_config_files_of_any_bytes_load_or_are_refused(data, named):
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "m"
        model.mkdir()
        (model / "config.pbtxt").write_bytes((b'name: "other"\n' if named else b"") + data)
        out = outcome(cfg.load_config, model)
        if not isinstance(out, cfg.ConfigError):
            assert out.name == "m"
            outcome(check, out)
