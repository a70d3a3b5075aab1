"""Model warmup: the config's `model_warmup` samples, made into requests and run on an
instance before it is reported loaded.

As Triton's core does (backend_model_instance.cc), each sample with a non-zero
`batch_size` becomes `batch_size` requests that run together as one batch, `count`
times (at least once), samples in config order; the first failing sample ends the
warmup and fails the load with "failed to run warmup sample '<name>': <errors>; ".
Every request of a sample carries the same data: zeros, random bytes, or the raw bytes
of `<model dir>/warmup/<input_data_file>`. A config input gets a leading batch dimension
of 1 when the model batches; names the config does not declare (control inputs) do not.
BYTES inputs given zero or random data get empty strings (a zero length prefix per
element, as Triton writes them); from a file they take the whole file as serialized
BYTES elements.

Warmup requests are built and run inside the worker and answered to nobody, so they
never reach the scheduler and never count in statistics.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np

from shm import datatypes
from shm.errors import InferError
from shm.messages.frontend import InferRequest, RequestOrigin
from shm.tensor import TensorRef

log = logging.getLogger("shmserve.warmup")

WARMUP_FOLDER = "warmup"  # Triton's kWarmupDataFolder, beside the version folders


class WarmupError(ValueError):
    """A warmup sample that cannot be built or that failed to run."""


@dataclass
class WarmupSample:
    """One `model_warmup` entry, ready to run: its batch of requests and how often."""

    name: str
    count: int
    requests: list[InferRequest]


def samples(config: dict, model: str, version: int, model_dir: str,
            rng: np.random.Generator | None = None) -> list[WarmupSample]:
    """The warmup samples of `config` (the model config as JSON), in order; batch size 0
    samples are skipped, as Triton skips them. Raises WarmupError naming the sample."""
    rng = rng if rng is not None else np.random.default_rng()
    out = []
    for setting in config.get("model_warmup", []) or []:
        name = setting.get("name", "")
        batch_size = int(setting.get("batch_size", 0) or 0)
        if batch_size == 0:
            log.debug("skipping batch 0 warmup sample '%s'", name)
            continue
        try:
            requests = sample_requests(setting, config, model, version, model_dir, rng)
        except WarmupError as exc:
            raise WarmupError(f"warmup sample '{name}': {exc}") from None
        out.append(WarmupSample(name, max(int(setting.get("count", 0) or 0), 1), requests))
    return out


def sample_requests(setting: dict, config: dict, model: str, version: int,
                    model_dir: str, rng: np.random.Generator) -> list[InferRequest]:
    """The `batch_size` requests of one warmup sample, all over the same input bytes."""
    batch_size = int(setting.get("batch_size", 0) or 0)
    max_batch = int(config.get("max_batch_size", 0) or 0)
    # model_config.proto: "For models that don't support batching, batch_size must be 1"
    if batch_size > max(max_batch, 1):
        limit = (f"max_batch_size {max_batch}" if max_batch
                 else "max_batch_size 0 (no batching), so batch_size must be 1")
        raise WarmupError(f"batch_size {batch_size} exceeds the model's {limit}")
    declared = {i.get("name") for i in config.get("input", [])}
    inputs = []
    for name, spec in (setting.get("inputs") or {}).items():
        datatype, dims, data = input_data(name, spec, model_dir, rng)
        shape = ([1] if max_batch and name in declared else []) + dims
        # Inline: the request never leaves this process, so its bytes need no arena.
        inputs.append(TensorRef(name, datatype, shape, data=data))
    return [InferRequest(0, "", model, version, list(inputs), origin=RequestOrigin.WARMUP)
            for _ in range(batch_size)]


def input_data(name: str, spec: dict, model_dir: str,
               rng: np.random.Generator) -> tuple[str, list[int], bytes]:
    """(datatype, dims, bytes) of one warmup input, checked as Triton checks it."""
    type_name = spec.get("data_type", "TYPE_INVALID")
    datatype = datatypes.from_config(type_name)
    if not datatypes.is_known(datatype):
        raise WarmupError(f"input '{name}' has unknown data type {type_name}")
    dims = [int(d) for d in spec.get("dims", [])]
    if any(d < 0 for d in dims):
        raise WarmupError("warmup setting expects all variable-size dimensions are "
                          f"specified for input '{name}'")
    count = datatypes.num_elements(dims)
    # BYTES: Triton sizes synthetic strings as one 4-byte (zero) length per element
    size = 4 * count if datatype == "BYTES" else datatypes.byte_size(datatype, dims)
    # The data kind is a oneof: present even when set to false ("zero_data: false").
    if "zero_data" in spec:
        return datatype, dims, bytes(size)
    if "random_data" in spec:
        if datatype == "BYTES":
            return datatype, dims, bytes(size)
        data = rng.bytes(size)
        if datatype == "BOOL":  # a bool byte must be 0 or 1
            data = (np.frombuffer(data, np.uint8) & 1).tobytes()
        return datatype, dims, data
    if "input_data_file" in spec:
        return datatype, dims, _file_data(name, spec["input_data_file"], datatype, count,
                                          size, model_dir)
    raise WarmupError(f"warmup setting expects input '{name}' to have input_data_type set")


def _file_data(name, filename, datatype, count, size, model_dir) -> bytes:
    path = os.path.join(model_dir, WARMUP_FOLDER, filename)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise WarmupError(f"failed to read data file for input '{name}': "
                          f"{exc.strerror}: {path}") from None
    if datatype == "BYTES":
        try:
            datatypes.deserialize_bytes(data, count)
        except ValueError as exc:
            raise WarmupError(f"data file {filename} for input '{name}' does not hold "
                              f"{count} serialized BYTES element(s): {exc}") from None
        return data
    if len(data) < size:
        raise WarmupError(f"warmup setting expects {size} bytes, but the data provided "
                          f"from {filename} only has {len(data)} bytes")
    return data[:size]  # a longer file is fine: its first bytes are used, as in Triton


def run(instance, samples_: list[WarmupSample], io, label: str = "") -> None:
    """Run every sample `count` times on `instance` through its ordinary execute();
    raise WarmupError with Triton's wording at the first sample that fails."""
    for sample in samples_:
        for iteration in range(1, sample.count + 1):
            log.debug("%s is running warmup sample '%s' for iteration %d", label,
                      sample.name, iteration)
            results = instance.execute(sample.requests, io)
            errors = [r.message for r in results if isinstance(r, InferError)]
            if len(results) != len(sample.requests):
                errors.append(f"{len(results)} responses for {len(sample.requests)} "
                              "requests")
            if errors:
                raise WarmupError(f"failed to run warmup sample '{sample.name}': "
                                  + "".join(e + "; " for e in errors))
