"""Framework model instances (onnxruntime, PyTorch) as the worker runs them.

A backend module supplies the model class (load, run on a dict of batch tensors); this
module does what every framework instance needs around it: gather the requests of a
batch into one tensor per input, place it on the instance's device, run, and split the
outputs back into per-request views. The copies this makes are the ones the design
allows, and are counted:
- a batch of one is never copied: the model gets the view over shared memory (or the
  client's CUDA region) itself; an input in a client's system region is read once into
  memory of the worker's own (workers/tensors.py says why), or on a GPU instance
  copied to the device from the pinned region;
- a larger batch is gathered once, straight into the batch tensor (system-region
  inputs read into their rows; on a GPU instance, host-to-device from the pinned
  arenas and regions into the device batch tensor; small tensors side by side are
  joined on the host first, so the batch crosses in one copy call);
- a request whose inputs cannot be read (its client shrank its region under them)
  fails alone: the batch runs without it;
- outputs are per-request slices of the model's batch outputs, written once by the
  worker's TensorIO (large device outputs go device-to-host straight into their
  destination, or device-to-device into a client's CUDA region; a batch of small ones
  wanted on the host comes back whole in one copy and is sliced there).
Ragged inputs, batch inputs and batch outputs follow Triton's ragged batching (see
workers/batch_io.py): a ragged input reaches the model flattened and concatenated, with
the batch inputs the config asks for beside it.
"""

from __future__ import annotations

import logging
import os
import time

import numpy as np

from shm import datatypes
from shm.errors import ErrorCode, InferError
from shm.messages.worker import LoadInstance
from workers import batch_io
from workers.instance import Instance
from workers.tensors import (DMA_MIN, Copies, TensorIO, copy_on_device, is_device_array,
                             targets_of)

log = logging.getLogger("shmserve.framework")

# Below this many bytes a host<->device copy costs its call (~10 us), not its bytes:
# small per-request tensors of a GPU batch are joined on the host and cross in one copy.
# The same bound as DMA_MIN: a view of a pinned client region is never joined there.
SMALL_TRANSFER = DMA_MIN


class _InputFailed(Exception):
    """Request `index` of a batch cannot give its inputs (e.g. its client shrank its
    region): it fails with `error`, alone, and the batch runs without it."""

    def __init__(self, index: int, error: InferError):
        super().__init__(error.message)
        self.index, self.error = index, error


class _RegionRows:
    """Request `index`'s input in a client's system region, not read yet: a batch
    reads it straight into its rows of the batch tensor (the one gather copy)."""

    __slots__ = ("ref", "index", "shape", "dtype")

    def __init__(self, ref, index: int, shape=None):
        self.ref, self.index = ref, index
        self.shape = tuple(ref.shape) if shape is None else shape
        self.dtype = np.dtype(datatypes.NUMPY[ref.datatype])

    def reshape(self, *shape):  # a ragged input: flattened (only reshape(-1) comes)
        return _RegionRows(self.ref, self.index, (datatypes.num_elements(self.shape),))


class FrameworkInstance(Instance):
    """One instance of a framework model; runs on its own thread in a device worker."""

    def __init__(self, msg: LoadInstance, config: dict, model_class, filename: str):
        self.model_name = msg.model
        self.config = config
        self.max_batch = int(config.get("max_batch_size", 0) or 0)
        self.copies = Copies()
        path = os.path.join(msg.model_dir, str(msg.version), filename)
        if not os.path.exists(path):
            raise FileNotFoundError(f"model file not found: {path}")
        self.stream = None
        if msg.kind == "KIND_GPU":
            from shm.cuda import cupy
            cp = cupy()
            self.device = f"cuda:{msg.device_id}"
            with cp.cuda.Device(msg.device_id):
                # each instance has its own stream, as Triton's instances do
                self.stream = cp.cuda.Stream(non_blocking=True)
        else:
            self.device = "cpu"
        self.model = model_class(config, path, self.device, msg.backend_config,
                                 self.stream.ptr if self.stream is not None else None)
        self.output_types = {o["name"]: datatypes.from_config(o["data_type"])
                             for o in config.get("output", [])}
        self.all_outputs = list(self.output_types)
        self.ragged = batch_io.ragged_inputs(config)
        self.batch_inputs = batch_io.batch_inputs(config)
        self.batch_outputs = batch_io.batch_outputs(config)

    def finalize(self) -> None:
        self.model.close()

    def execute(self, requests, io: TensorIO):
        """Per request: a list of (name, datatype, array), or an InferError."""
        if self.stream is not None:
            with self.stream:
                return self._execute(requests, io)
        return self._execute(requests, io)

    def _execute(self, requests, io: TensorIO):
        names = [ref.name for ref in requests[0].inputs]
        same = sorted(names)
        if any(sorted(r.name for r in req.inputs) != same for req in requests[1:]):
            # optional inputs given by some requests only: run them one by one
            results = []
            for req in requests:
                results.extend(self._execute([req], io))
            return results
        self.input_end_ns = self.output_start_ns = 0
        failed: dict[int, InferError] = {}  # requests that fail alone, by position
        live = list(range(len(requests)))
        while True:
            batch = [requests[i] for i in live] if failed else requests
            try:
                inputs, sizes, shapes = self._gather(batch, names, io)
                break
            except _InputFailed as exc:  # rare: gather again without that request
                failed[live.pop(exc.index)] = exc.error
                if not live:
                    return [failed[i] for i in range(len(requests))]
            except InferError as exc:
                return [failed.get(i, exc) for i in range(len(requests))]
            except Exception as exc:
                log.exception("failed to gather inputs of '%s'", self.model_name)
                err = InferError(ErrorCode.INTERNAL, f"failed to gather inputs: {exc}")
                return [failed.get(i, err) for i in range(len(requests))]
        results = self._run(batch, inputs, sizes, shapes)
        if not failed:
            return results
        merged, ran = [], iter(results)
        for i in range(len(requests)):
            merged.append(failed[i] if i in failed else next(ran))
        return merged

    def _run(self, requests, inputs, sizes, shapes):
        wanted = self._wanted(requests)
        self.input_end_ns = time.monotonic_ns()
        try:
            outputs = self.model.run(inputs, wanted)
        except InferError as exc:
            return [exc] * len(requests)
        except Exception as exc:
            log.exception("model '%s' failed", self.model_name)
            return [InferError(ErrorCode.INTERNAL,
                               f"model '{self.model_name}' failed: {exc}")] * len(requests)
        self.output_start_ns = time.monotonic_ns()
        return self._split(requests, outputs, sizes, shapes)

    def _wanted(self, requests) -> list[str]:
        wanted: list[str] = []
        for req in requests:
            if req.outputs is None:
                return self.all_outputs
            for o in req.outputs:
                if o.name not in wanted:
                    wanted.append(o.name)
        return wanted

    def _gather(self, requests, names, io: TensorIO):
        on_device = self.stream is not None
        copies = self.copies
        per_input: dict[str, list] = {}
        # each request's shape per input, for the batch inputs and outputs that need it
        shapes: dict[str, list[tuple[int, ...]]] = {}
        need_shapes = bool(self.batch_inputs or self.batch_outputs)
        gathered = not on_device and len(requests) > 1
        for index, req in enumerate(requests):
            for ref in req.inputs:
                if (gathered and ref.region > 0 and ref.device < 0
                        and ref.datatype != "BYTES" and ref.data is None):
                    array = _RegionRows(ref, index)  # read into the batch tensor below
                else:
                    try:
                        # a CPU model given CUDA memory gets it with one device-to-host
                        # copy; a GPU one copies a large pinned system region by DMA
                        array = (io.input(ref, copies, dma=True) if on_device
                                 else io.host_input(ref, copies))
                    except InferError as exc:
                        raise _InputFailed(index, exc) from None
                per_input.setdefault(ref.name, []).append(array)
                if need_shapes:
                    shapes.setdefault(ref.name, []).append(tuple(ref.shape))
        sizes = [req.batch_size if self.max_batch else 1 for req in requests]
        inputs = {}
        for name, arrays in per_input.items():
            if name in self.ragged:
                # Triton's backends take a ragged input as one 1-D tensor, batch of
                # one included: every request's elements, one after the other
                arrays = [a.reshape(-1) for a in arrays]
            # BYTES stay on the host: devices hold no strings, and the backend takes
            # them there (onnxruntime runs such a batch through session.run)
            device = on_device and arrays[0].dtype != object
            if len(arrays) == 1:
                inputs[name] = self._to_device(arrays[0]) if device else arrays[0]
            elif device:
                inputs[name] = self._gather_device(arrays)
            else:
                inputs[name] = self._gather_host(arrays, io)
        for spec in self.batch_inputs:
            source = shapes.get(spec.source)
            if source is None:
                raise InferError(ErrorCode.INVALID_ARG,
                                 f"batch input '{', '.join(spec.targets)}' of model "
                                 f"'{self.model_name}' needs input '{spec.source}', which "
                                 "the request does not give")
            value = batch_io.generate(spec.kind, spec.datatype, source)
            if on_device:
                value = self._to_device(value)
            for target in spec.targets:
                inputs[target] = value
        return inputs, sizes, shapes

    def _gather_host(self, arrays, io: TensorIO):
        """One host batch tensor from per-request arrays and system-region inputs not
        read yet: each is copied once, into its rows."""
        copies = self.copies
        first = arrays[0]
        pending = any(isinstance(a, _RegionRows) for a in arrays)
        if pending and (not first.shape or any(
                a.shape[1:] != first.shape[1:] or a.dtype != first.dtype for a in arrays)):
            # what np.concatenate converts or refuses: read them, and let it
            arrays = [self._read(a, io) if isinstance(a, _RegionRows) else a
                      for a in arrays]
            pending = False
        if not pending:
            batch = np.concatenate(arrays, axis=0)  # the one gather copy
            copies.host += batch.nbytes if batch.dtype != object else 0
            return batch
        batch = np.empty((sum(a.shape[0] for a in arrays),) + first.shape[1:], first.dtype)
        row = 0
        for a in arrays:
            part = batch[row:row + a.shape[0]]
            if isinstance(a, _RegionRows):
                self._read(a, io, part)
            else:
                part[...] = a
                copies.host += part.nbytes
            row += a.shape[0]
        return batch

    def _read(self, rows: _RegionRows, io: TensorIO, out=None):
        try:
            buf = io.read_region(rows.ref, self.copies, out)
        except InferError as exc:
            raise _InputFailed(rows.index, exc) from None
        return buf if out is not None else datatypes.tensor_from_buffer(
            rows.ref.datatype, rows.shape, buf)

    def _to_device(self, array):
        if is_device_array(array):
            return array  # already in the client's CUDA region: bound as it is
        from shm.cuda import cupy
        cp = cupy()
        dev = cp.empty(array.shape, dtype=array.dtype)
        dev.set(array, stream=self.stream)
        self.copies.to_device(array.nbytes)
        return dev

    def _gather_device(self, arrays):
        """One device batch tensor from per-request arrays. Small host arrays next to
        each other are joined on the host first and go over in one host-to-device copy:
        a copy call costs ~10 us whatever its size, which for [1,512] rows is far more
        than the bytes. Large ones (and device arrays) are copied one by one, straight
        from where they lie."""
        from shm.cuda import cupy
        cp = cupy()
        first = arrays[0]
        total = sum(a.shape[0] for a in arrays)
        batch = cp.empty((total,) + tuple(first.shape[1:]), dtype=first.dtype)
        copies = self.copies
        row = i = 0
        while i < len(arrays):
            a = arrays[i]
            if is_device_array(a):
                copy_on_device(batch[row:row + a.shape[0]], a, self.stream)
                copies.on_device(a.nbytes)
                row += a.shape[0]
                i += 1
                continue
            j = i + 1  # the run of host arrays from i
            while (j < len(arrays) and not is_device_array(arrays[j])
                   and arrays[j].nbytes < SMALL_TRANSFER and a.nbytes < SMALL_TRANSFER):
                j += 1
            rows = sum(x.shape[0] for x in arrays[i:j])
            if j - i > 1:
                host = np.concatenate(arrays[i:j], axis=0)
                copies.host += host.nbytes
            else:
                host = np.ascontiguousarray(a)
            batch[row:row + rows].set(host, stream=self.stream)
            copies.to_device(host.nbytes)
            row += rows
            i = j
        return batch

    def _host_copies(self, requests, targets: list, outputs: dict) -> dict:
        """Device outputs of a batch that are best brought to the host whole: those
        some request wants on the host (not in a CUDA region) and whose rows are
        small. One device-to-host copy then serves every such request, instead of one
        copy (and one wait on the stream) per request. `targets`: each request's
        targets_of()."""
        hosts = {}
        for name, array in outputs.items():
            if (not is_device_array(array) or name in self.batch_outputs  # scattered
                    or array.nbytes >= SMALL_TRANSFER * len(requests)):
                continue
            for req, req_targets in zip(requests, targets):
                wanted = req.outputs is None or any(o.name == name for o in req.outputs)
                if wanted and _on_host(req_targets, name):
                    hosts[name] = array.get(stream=self.stream)
                    self.copies.to_host(array.nbytes)
                    break
        return hosts

    def _split(self, requests, outputs: dict, sizes: list[int], shapes: dict):
        total = sum(sizes)
        scattered = {}  # batch outputs: each request's part, in its source input's shape
        for name, array in outputs.items():
            expected = self.output_types.get(name)
            got = _datatype_of(array)
            if expected is not None and got != expected and not (
                    expected == "BF16" and got == "UINT16"):  # BF16 travels as words
                err = InferError(ErrorCode.INTERNAL,
                                 f"unexpected datatype {got} for inference output '{name}' "
                                 f"of model '{self.model_name}', expecting {expected}")
                return [err] * len(requests)
            spec = self.batch_outputs.get(name)
            if spec is not None:
                try:
                    scattered[name] = batch_io.scatter(array, shapes.get(spec.source, []),
                                                       name)
                except InferError as err:
                    return [err] * len(requests)
                continue
            if len(requests) > 1 and (array.ndim == 0 or array.shape[0] != total):
                err = InferError(ErrorCode.INTERNAL,
                                 f"output '{name}' of model '{self.model_name}' has shape "
                                 f"{list(array.shape)}, which does not hold a batch of "
                                 f"{total}")
                return [err] * len(requests)
        hosts = {}
        if self.stream is not None and len(requests) > 1:
            targets = [targets_of(req) for req in requests]
            hosts = self._host_copies(requests, targets, outputs)
        results = []
        row = 0
        for index, (req, size) in enumerate(zip(requests, sizes)):
            wanted = None if req.outputs is None else {o.name for o in req.outputs}
            out = []
            for name, array in outputs.items():
                if wanted is not None and name not in wanted:
                    continue
                if name in scattered:
                    part = scattered[name][index]
                else:
                    if name in hosts and _on_host(targets[index], name):
                        array = hosts[name]
                    part = array if len(requests) == 1 else array[row:row + size]
                out.append((name, self.output_types.get(name) or _datatype_of(array), part))
            results.append(out)
            row += size
        return results


def _on_host(targets: dict | None, name: str) -> bool:
    """Whether output `name` goes to host memory (the arena, a system region) rather
    than into a client's CUDA region, for a request with these targets_of()."""
    target = targets.get(name) if targets else None
    return target is None or target.device < 0


def _datatype_of(array) -> str:
    dtype = np.dtype(array.dtype)
    return datatypes.from_numpy(dtype)
