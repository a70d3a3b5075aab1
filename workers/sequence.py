"""The worker's half of the sequence batcher: control tensors and implicit state.

The scheduler sends a stateful model's batch as requests tagged with their sequence
slot, plus the slots whose rows are not-ready fillers (direct strategy). Here each row
becomes a request the backend runs like any other: the control inputs the config names
(CONTROL_SEQUENCE_START / _END / _READY / _CORRID, in their int32, fp32, bool or
data_type forms) and the `state` inputs are added as tensors of the row, and the
state outputs are taken from the row's results and kept for the slot's next request
(Triton's SequenceStates, one per slot). A filler row carries zeros, READY false and
the initial state; its results are dropped. Framework models and, beyond Triton,
python models get their state the same way: as inputs by `input_name`, taken back
from outputs by `output_name`.

State stays where the model produced it: numpy on a CPU instance, the device array
on a GPU instance (handed back to the backend as it is, no copy).
"""

from __future__ import annotations

import logging
import os

import msgspec
import numpy as np

from shm import datatypes
from shm.messages.frontend import InferRequest, RequestedOutput
from shm.messages.worker import ExecuteBatch
from shm.tensor import TensorRef

log = logging.getLogger("shmserve.sequence")

_BOOL_KINDS = {"CONTROL_SEQUENCE_START": "start", "CONTROL_SEQUENCE_END": "end",
               "CONTROL_SEQUENCE_READY": "ready"}


class LocalTensor(TensorRef):
    """A tensor this process made (a control or a state): the backend reads `array`
    itself instead of a buffer (workers/tensors.py TensorIO.input)."""

    array: object = None


def _local(name: str, datatype: str, array) -> LocalTensor:
    return LocalTensor(name, datatype, list(array.shape), array=array)


class _Control:
    __slots__ = ("name", "signal", "datatype", "values")

    def __init__(self, name: str, control: dict):
        self.name = name
        kind = control.get("kind", "")
        self.signal = _BOOL_KINDS.get(kind, "corrid")
        if control.get("int32_false_true"):
            self.datatype = "INT32"
            self.values = [int(v) for v in control["int32_false_true"]]
        elif control.get("fp32_false_true"):
            self.datatype = "FP32"
            self.values = [float(v) for v in control["fp32_false_true"]]
        elif control.get("bool_false_true"):
            self.datatype = "BOOL"
            self.values = [bool(v) for v in control["bool_false_true"]]
        else:  # CORRID: the correlation id in the type the config names
            self.datatype = datatypes.from_config(control.get("data_type", "TYPE_UINT64"))
            self.values = None


class _State:
    __slots__ = ("input_name", "output_name", "datatype", "initial")

    def __init__(self, state: dict, batching: bool, folders: list[str]):
        self.input_name = state["input_name"]
        self.output_name = state["output_name"]
        self.datatype = datatypes.from_config(state["data_type"])
        dims = [1 if int(d) < 0 else int(d) for d in state.get("dims", [])]
        initial = (state.get("initial_state") or [None])[0]
        if initial is not None and initial.get("dims") is not None:
            dims = [int(d) for d in initial["dims"]]
        shape = ([1] if batching else []) + dims
        dtype = datatypes.NUMPY[self.datatype]
        if initial is not None and initial.get("data_file"):
            self.initial = _read_initial(folders, initial["data_file"], self.datatype,
                                         shape)
        elif self.datatype == "BYTES":
            self.initial = np.full(shape, b"", dtype=object)
        else:  # zero_data, and what Triton leaves unset: zeros
            self.initial = np.zeros(shape, dtype=dtype)


def _read_initial(folders: list[str], name: str, datatype: str, shape):
    for folder in folders:
        path = os.path.join(folder, "initial_state", name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                raw = f.read()
            if datatype == "BYTES":
                return datatypes.tensor_from_buffer("BYTES", shape, raw).copy()
            dtype = datatypes.NUMPY[datatype]
            count = datatypes.num_elements(shape)
            if len(raw) < count * dtype.itemsize:
                # Triton's words, its missing space included
                raise ValueError(f"initial_state setting expects {count * dtype.itemsize} "
                                 f"bytes, but the data provided from {name}only has "
                                 f"{len(raw)} bytes.")
            return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape).copy()
    raise ValueError(f"initial state file '{name}' not found in "
                     f"{' or '.join(os.path.join(f, 'initial_state') for f in folders)}")


class SequenceContext:
    """One stateful instance's controls, state config and per-slot state."""

    def __init__(self, config: dict, model_dir: str, device_array=None):
        seq = config.get("sequence_batching") or {}
        self.batching = int(config.get("max_batch_size") or 0) > 0
        self.controls = [_Control(ci["name"], c) for ci in seq.get("control_input") or []
                         for c in ci.get("control") or []]
        folders = [model_dir]  # Triton: <model>/initial_state/<data_file>, as warmup/
        self.states = [_State(s, self.batching, folders) for s in seq.get("state") or []]
        self.state_outputs = {s.output_name for s in self.states}
        self.outputs = [o["name"] for o in config.get("output") or []]
        # a GPU instance keeps its state on the device: `device_array(np)` puts it there
        self.device_array = device_array
        self.store: dict[int, dict[str, object]] = {}  # slot -> state input -> array
        self._flag_tensors: dict[tuple[str, bool], LocalTensor] = {}
        self._fillers: dict[tuple, list[TensorRef]] = {}  # input signature -> inputs

    # -- rows in ---------------------------------------------------------------------

    def rows(self, msg: ExecuteBatch) -> tuple[list[InferRequest], list[int]]:
        """The requests the backend runs, in row order, and for each row the index of
        its real request (-1 for a filler)."""
        if not msg.fillers:
            order = list(range(len(msg.requests)))
        else:
            by_slot = {slot: i for i, slot in enumerate(msg.slots)}
            order = [by_slot.get(s, -1) for s in sorted([*msg.slots, *msg.fillers])]
        template = msg.requests[0]
        rows = []
        filler_slots = iter(msg.fillers)
        for index in order:
            if index < 0:
                rows.append(self._filler(template, next(filler_slots)))
            else:
                rows.append(self._row(msg.requests[index], msg.slots[index]))
        return rows, order

    def _row(self, req: InferRequest, slot: int) -> InferRequest:
        extra = self._controls(req.sequence_start, req.sequence_end, True, req.sequence_id)
        if self.states:
            if req.sequence_start or slot not in self.store:
                self.store[slot] = {s.input_name: self._initial(s) for s in self.states}
            current = self.store[slot]
            extra += [_local(s.input_name, s.datatype, current[s.input_name])
                      for s in self.states]
        outputs = req.outputs
        if self.states:  # the state outputs are asked for beside the client's
            names = [o.name for o in outputs] if outputs is not None else self.outputs
            outputs = [RequestedOutput(n) for n in names if n not in self.state_outputs]
            outputs += [RequestedOutput(n) for n in self.state_outputs]
        return msgspec.structs.replace(req, inputs=[*req.inputs, *extra], outputs=outputs)

    def _filler(self, template: InferRequest, slot: int) -> InferRequest:
        """Triton's null request: the batch's input shapes, zeros, READY false,
        correlation id 0, the initial state (the slot's own state is left alone)."""
        key = tuple((ref.name, ref.datatype, tuple(ref.shape)) for ref in template.inputs)
        inputs = self._fillers.get(key)
        if inputs is None:  # made once per input signature: fillers are read only
            inputs = []
            for ref in template.inputs:
                if ref.datatype == "BYTES":  # empty strings: a zero length each
                    data = bytes(4 * datatypes.num_elements(ref.shape))
                else:
                    data = bytes(datatypes.num_elements(ref.shape)
                                 * datatypes.NUMPY[ref.datatype].itemsize)
                inputs.append(TensorRef(ref.name, ref.datatype, list(ref.shape), data=data))
            corrid = "" if isinstance(template.sequence_id, str) else 0
            inputs += self._controls(False, False, False, corrid)
            inputs += [_local(s.input_name, s.datatype, self._initial(s))
                       for s in self.states]
            self._fillers[key] = inputs
        outputs = None
        if self.states:
            outputs = [RequestedOutput(n) for n in self.outputs]
            outputs += [RequestedOutput(n) for n in self.state_outputs]
        return InferRequest(-1, "", template.model, template.version, inputs, outputs,
                            batch_size=1)

    def _controls(self, start: bool, end: bool, ready: bool, corrid) -> list[TensorRef]:
        shape = [1, 1] if self.batching else [1]
        out = []
        flags = {"start": start, "end": end, "ready": ready}
        for c in self.controls:
            if c.signal != "corrid":
                # the same few tensors every row: made once (models only read them)
                key = (c.name, flags[c.signal])
                tensor = self._flag_tensors.get(key)
                if tensor is None:
                    array = np.full(shape, c.values[1 if key[1] else 0],
                                    dtype=datatypes.NUMPY[c.datatype])
                    array.flags.writeable = False  # shared by every row
                    tensor = self._flag_tensors[key] = _local(c.name, c.datatype,
                                                              self._placed(array))
                out.append(tensor)
                continue
            if c.datatype == "BYTES":
                array = np.array([str(corrid).encode()], dtype=object).reshape(shape)
            else:
                # Triton copies the id's first bytes (little-endian uint64) into the
                # control, so a 32-bit CORRID gets the id's low 32 bits
                value = corrid if isinstance(corrid, int) else 0
                raw = (value & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "little")
                array = np.frombuffer(raw, dtype=datatypes.NUMPY[c.datatype],
                                      count=1).reshape(shape).copy()
            out.append(_local(c.name, c.datatype, self._placed(array)))
        return out

    def _initial(self, state: _State):
        # a copy: the model may update its state input in place
        return self._placed(state.initial.copy())

    def _placed(self, array):
        if self.device_array is None or array.dtype == object:
            return array
        return self.device_array(array)

    # -- results out -------------------------------------------------------------------

    def results(self, msg: ExecuteBatch, rows: list[InferRequest], order: list[int],
                results: list) -> list:
        """Each real request's result, in msg.requests order: the state outputs kept
        for the slot (and dropped unless the client asked for them), fillers dropped."""
        out = [None] * len(msg.requests)
        for row, index, result in zip(rows, order, results):
            if index < 0:
                continue
            req = msg.requests[index]
            if self.states and isinstance(result, list):
                result = self._keep_state(msg.slots[index], req, result)
            out[index] = result
        return out

    def _keep_state(self, slot: int, req: InferRequest, result: list) -> list:
        current = self.store.setdefault(slot, {})
        wanted = None if req.outputs is None else {o.name for o in req.outputs}
        kept = []
        for name, datatype, array in result:
            for s in self.states:
                if s.output_name == name:
                    # the output may be a view of the batch output: keep a copy of
                    # this row (on the device for a GPU instance)
                    current[s.input_name] = array.copy()
            if name in self.state_outputs and name not in (
                    self.outputs if wanted is None else wanted):
                continue  # state the client did not ask for
            kept.append((name, datatype, array))
        if req.sequence_end:
            self.store.pop(slot, None)  # the next sequence here starts with START
        return kept
