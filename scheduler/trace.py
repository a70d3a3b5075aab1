"""Triton's trace extension: which requests are traced, and the trace file they go to.

The scheduler sees every request of every frontend, so sampling here makes `trace_rate`
and `trace_count` hold server-wide. `TraceManager.sample` marks a request on enqueue;
`complete` writes its TIMESTAMPS records once its batch is done (or it failed).

Settings follow Triton's TraceManager: a global setting (its fallback: the
--trace-config values) and per-model settings whose unspecified fields follow the
global one; a null value clears a field back to its fallback; a model setting with no
field of its own is dropped. Each setting object keeps its own counters; an update
replaces the object, and the old one writes out what it collected once its last
outstanding trace is done.

Files, as Triton writes them: with log_frequency 0, traces gather in the setting and
are written to `trace_file` when the setting is replaced or the server stops (kept a
valid JSON array after every write, where Triton closes it only at exit); with
log_frequency N, every N traces go to `<trace_file>.<k>`, k = 0, 1, ...; and when
trace_count runs out and every counted trace is collected, they go to the next
`<trace_file>.<k>` at once.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os

import orjson

from shm.errors import ErrorCode, InferError

log = logging.getLogger("shmserve.trace")

LEVELS = ("TIMESTAMPS", "TENSORS")
_UINT32_MAX = 2**32 - 1
_INT32_MAX = 2**31 - 1
_FIELDS = ("level", "rate", "count", "log_frequency")
_SETTING_OF = {"trace_level": "level", "trace_rate": "rate", "trace_count": "count",
               "log_frequency": "log_frequency"}


@dataclasses.dataclass(frozen=True)
class TraceConfig:
    """--trace-config values (Triton's defaults): the global setting's fallback."""

    level: frozenset = frozenset()  # empty: OFF
    rate: int = 1000
    count: int = -1
    log_frequency: int = 0
    file: str = ""


# -- parsing ----------------------------------------------------------------------------

def _level(names) -> frozenset:
    names = [n.upper() for n in names]
    if "OFF" in names:
        if len(names) != 1:
            raise ValueError("Expect only one trace level 'OFF' is specified")
        return frozenset()
    for n in names:
        if n not in LEVELS:
            raise ValueError(f"invalid trace level '{n}': expected OFF, TIMESTAMPS or "
                             "TENSORS")
    return frozenset(names)


def _integer(name: str, text: str, low: int, high: int) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f"Unable to parse '{name}', got: {text}") from None
    if name == "trace_count" and value < low:
        raise ValueError(f"Unable to parse 'trace_count'. Expecting value >= {low}, "
                         f"got:{text}")
    if not low <= value <= high:
        raise ValueError(f"Unable to parse '{name}', value is out of range "
                         f"[ {low}, {high} ], got: {text}")
    return value


_RANGES = {"trace_rate": (0, _UINT32_MAX), "trace_count": (-1, _INT32_MAX),
           "log_frequency": (0, _UINT32_MAX)}


def parse_trace_config(items: list[str]) -> TraceConfig:
    """--trace-config `[<mode>,]<setting>=<value>` items, as tritonserver reads them:
    global settings rate, level (repeatable), count, mode; triton settings file and
    log-frequency. Raises ValueError."""
    values: dict = {}
    levels: list[str] = []
    for item in items:
        mode, sep, rest = item.partition(",")
        if not sep:
            mode, rest = "", item
        name, eq, value = rest.partition("=")
        if not eq or not name:
            raise ValueError(f"--trace-config option format is "
                             f"'[<mode>,]<setting>=<value>'. Got {item}")
        if mode not in ("", "triton", "opentelemetry"):
            raise ValueError(f"unknown trace mode '{mode}' in --trace-config {item}")
        if mode == "opentelemetry" or (name == "mode" and value != "triton"):
            raise ValueError(f"only the 'triton' trace mode is supported, got {item}")
        if name == "level":
            levels.append(value)
        elif name in ("rate", "count") and mode in ("", "triton"):
            key = "trace_" + name
            values[name] = _integer(key, value, *_RANGES[key])
        elif name in ("log-frequency", "log_frequency") and mode == "triton":
            values["log_frequency"] = _integer("log_frequency", value,
                                               *_RANGES["log_frequency"])
        elif name == "file" and mode == "triton":
            values["file"] = value
        elif name != "mode":
            raise ValueError(f"unknown --trace-config setting in {item}")
    if levels:
        values["level"] = _level(levels)
    return TraceConfig(**values)


def parse_update(update: dict) -> dict:
    """A client's trace settings (HTTP JSON, or gRPC values already as str / list /
    None) -> {field: value, or None to clear}. Raises InferError; names Triton does not
    update are ignored, as Triton does."""
    if "trace_file" in update:
        raise InferError(ErrorCode.UNSUPPORTED,
                         "trace file location can not be updated through network protocol")
    out: dict = {}
    for key, field in _SETTING_OF.items():
        if key not in update:
            continue
        value = update[key]
        try:
            if value is None or value == []:
                out[field] = None  # clear: fall back again
            elif key == "trace_level":
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise ValueError(f"expect an array of strings for 'trace_level', "
                                     f"got {value!r}")
                out[field] = _level(value)
            else:
                if isinstance(value, list):
                    if len(value) != 1:
                        raise ValueError(f"expect only 1 value for '{key}'")
                    value = value[0]
                if not isinstance(value, str):
                    raise ValueError(f"expect a string for '{key}', got {value!r}")
                out[field] = _integer(key, value, *_RANGES[key])
        except ValueError as exc:
            raise InferError(ErrorCode.INVALID_ARG, str(exc)) from None
    return out


# -- the file --------------------------------------------------------------------------

class TraceFile:
    """One trace file path and its indexed companions `<path>.<k>`."""

    def __init__(self, path: str):
        self.path = path
        self.index = 0
        self.started = False

    def save(self, traces: list[bytes], indexed: bool) -> None:
        body = b",".join(traces)
        try:
            if indexed:
                with open(f"{self.path}.{self.index}", "wb") as f:
                    f.write(b"[" + body + b"]")
                self.index += 1
            elif not self.started:  # a server run starts the file afresh, as Triton
                with open(self.path, "wb") as f:
                    f.write(b"[" + body + b"]")
                self.started = True
            else:  # replace the closing bracket: the file stays one valid JSON array
                with open(self.path, "r+b") as f:
                    f.seek(-1, os.SEEK_END)
                    f.write(b"," + body + b"]")
        except OSError as exc:
            log.error("failed writing trace file %s: %s", self.path, exc)


# -- settings ----------------------------------------------------------------------------

class TraceSetting:
    """One setting in force (global or a model's) with its counters and its traces not
    yet written. `specified`: the fields set here rather than taken from the fallback."""

    def __init__(self, level: frozenset, rate: int, count: int, log_frequency: int,
                 file: TraceFile, specified: frozenset = frozenset()):
        self.level = level
        self.rate = rate
        self.count = count
        self.log_frequency = log_frequency
        self.file = file
        self.specified = specified
        self.sampled = 0  # requests seen while valid (Triton's sample_)
        self.created = 0
        self.collected = 0
        self.outstanding = 0
        self.buffer: list[bytes] = []
        self.retired = False

    @property
    def invalid_reason(self) -> str:
        if not self.level:
            return "tracing is disabled"
        if self.rate == 0:
            return "sample rate must be non-zero"
        if not self.file.path:
            return "trace file name is not given"
        return ""

    def sample(self) -> bool:
        """Whether this request is traced: every `rate`-th, while `count` lasts."""
        if self.count == 0 or self.invalid_reason:
            return False
        self.sampled += 1
        if self.sampled % self.rate:
            return False
        if self.count > 0:
            self.count -= 1
        self.created += 1
        self.outstanding += 1
        return True

    def collect(self, trace: bytes) -> None:
        self.outstanding -= 1
        self.buffer.append(trace)
        self.collected += 1
        if ((self.count == 0 and self.collected == self.created)
                or (self.log_frequency and len(self.buffer) >= self.log_frequency)):
            self.file.save(self.buffer, indexed=True)
            self.buffer = []
        elif self.retired and not self.outstanding:
            self.flush()

    def flush(self) -> None:
        if self.buffer:
            self.file.save(self.buffer, indexed=self.log_frequency != 0)
            self.buffer = []

    def describe(self) -> dict:
        """As Triton's trace setting endpoint answers (every value a string)."""
        return {"trace_level": [n for n in LEVELS if n in self.level] or ["OFF"],
                "trace_rate": str(self.rate), "trace_count": str(self.count),
                "log_frequency": str(self.log_frequency), "trace_file": self.file.path,
                "trace_mode": "triton"}


def trace_records(trace_id: int, model: str, version: int, request_id: str,
                  timestamps: list[tuple[str, int]]) -> bytes:
    """One trace as Triton's TIMESTAMPS level writes it: the model record, then one
    record per timestamp, comma-joined (an element list, without the brackets)."""
    head = {"id": trace_id, "model_name": model, "model_version": version}
    if request_id:
        head["request_id"] = request_id
    parts = [orjson.dumps(head)]
    parts += [orjson.dumps({"id": trace_id, "timestamps": [{"name": name, "ns": ns}]})
              for name, ns in timestamps]
    return b",".join(parts)


class TraceManager:
    """Every trace setting of the server, the sampling decision and the writing."""

    def __init__(self, config: TraceConfig):
        self.config = config
        self.files: dict[str, TraceFile] = {}
        self.global_setting = TraceSetting(config.level, config.rate, config.count,
                                           config.log_frequency, self._file(config.file))
        self.models: dict[str, TraceSetting] = {}
        self.pending: dict[int, tuple] = {}  # trace id -> (setting, model, version, id)
        self.retired: list[TraceSetting] = []
        self._ids = itertools.count(1)
        self.active = bool(config.level)  # any level on: the only per-request check

    def _file(self, path: str) -> TraceFile:
        f = self.files.get(path)
        if f is None:
            f = self.files[path] = TraceFile(path)
        return f

    # -- settings --

    def settings(self, model: str = "") -> dict:
        return self.models.get(model, self.global_setting).describe()

    def update(self, model: str, update: dict) -> None:
        """Apply a client's update (see parse_update) to the global setting (`model`
        empty) or to a model's. Raises InferError and changes nothing on a bad one."""
        self._update(model, parse_update(update))

    def _update(self, model: str, changes: dict) -> None:
        if model:
            current = self.models.get(model)
            fallback = self.global_setting
        else:
            current = self.global_setting
            fallback = self.config
        specified = set(current.specified) if current is not None else set()
        values = {}
        for field in _FIELDS:
            if field in changes:
                if changes[field] is None:
                    specified.discard(field)
                else:
                    specified.add(field)
            if field in changes and changes[field] is not None:
                values[field] = changes[field]
            elif field in specified:
                values[field] = getattr(current, field)
            else:
                values[field] = getattr(fallback, field)
        file = self.global_setting.file if model else self._file(self.config.file)
        if model and not specified:  # nothing of its own: the model follows the global
            if current is not None:
                self._retire(self.models.pop(model))
            self._refresh()
            return
        new = TraceSetting(values["level"], values["rate"], values["count"],
                           values["log_frequency"], file, frozenset(specified))
        if new.level and new.invalid_reason:
            raise InferError(ErrorCode.INVALID_ARG, "Attempting to set invalid trace "
                                                    f"setting :{new.invalid_reason}")
        if current is not None:
            self._retire(current)
        if model:
            self.models[model] = new
        else:
            self.global_setting = new
            # models that take some fields from the global setting: re-derive them
            following = sorted(name for name, s in self.models.items()
                               if len(s.specified) < len(_FIELDS))
            for name in following:
                try:
                    self._update(name, {})
                except InferError as exc:
                    log.warning("trace setting of model '%s' kept: %s", name, exc.message)
        self._refresh()

    def _retire(self, setting: TraceSetting) -> None:
        setting.retired = True
        if setting.outstanding:
            self.retired.append(setting)  # it writes out once its last trace is done
        else:
            setting.flush()
        self.retired = [s for s in self.retired if s.outstanding]

    def _refresh(self) -> None:
        self.active = bool(self.global_setting.level) or any(
            s.level for s in self.models.values())

    # -- requests --

    def sample(self, model: str, version: int, request_id: str) -> int:
        """A trace id for this request if it is to be traced, else 0."""
        setting = self.models.get(model, self.global_setting)
        if not setting.sample():
            return 0
        trace_id = next(self._ids)
        self.pending[trace_id] = (setting, model, version, request_id)
        return trace_id

    def complete(self, trace_id: int, timestamps: list[tuple[str, int]]) -> None:
        entry = self.pending.pop(trace_id, None)
        if entry is None:
            return
        setting, model, version, request_id = entry
        setting.collect(trace_records(trace_id, model, version, request_id, timestamps))

    def close(self) -> None:
        """The server stops: write out what every setting holds."""
        for trace_id in list(self.pending):  # never finished: written as far as known
            self.complete(trace_id, [])
        for setting in [self.global_setting, *self.models.values(), *self.retired]:
            setting.flush()


def request_timestamps(q, done=None, end_ns: int = 0) -> list[tuple[str, int]]:
    """A request's (Queued) TIMESTAMPS records in Triton's order. `done`: the BatchDone
    of the batch it ran in (None: it failed before running)."""
    out = [("REQUEST_START", q.req.start_ns)]
    if q.queue_ns:
        out.append(("QUEUE_START", q.queue_ns))
    if done is not None:
        out += [("COMPUTE_START", done.compute_start_ns),
                ("COMPUTE_INPUT_END", done.input_end_ns),
                ("COMPUTE_OUTPUT_START", done.output_start_ns),
                ("COMPUTE_END", done.compute_end_ns)]
    out.append(("REQUEST_END", end_ns))
    return out
