"""Load-time checks of an ensemble's steps against the configs of the models they
name, after Triton's ValidateEnsembleConfig (core `ensemble_utils.cc`), with its
messages: inputs and outputs that exist, consistent types and shapes, batch sizes, and
the lines of decoupled steps, which decide whether the ensemble is decoupled. The
config-only checks (data flow, unused tensors) are in scheduler/repository/config.py.
"""

from __future__ import annotations

import dataclasses

from tritonclient.grpc.model_config_pb2 import DataType, ModelConfig


class EnsembleError(Exception):
    """The ensemble cannot be loaded with the step models it names (Triton's reason)."""


def _dims(dims, batching: bool) -> tuple:
    return ((-1,) if batching else ()) + tuple(dims)


def _same_dims(a, b) -> bool:
    # -1 matches anything; a variable shape is checked when requests run
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b))


@dataclasses.dataclass
class _Tensor:
    model: str
    datatype: int
    dims: tuple
    full_dims: tuple


def _consistent(ensemble: str, name: str, known: _Tensor, new: _Tensor) -> None:
    where = f"in ensemble {ensemble}, ensemble tensor {name}: "
    if known.datatype != new.datatype:
        raise EnsembleError(
            where + f"inconsistent data type: {DataType.Name(known.datatype)} is inferred "
            f"from model {known.model} while {DataType.Name(new.datatype)} is inferred "
            f"from model {new.model}")
    # a tensor shared by a batching and a non-batching model may match on full dims
    if not _same_dims(known.dims, new.dims) and not _same_dims(known.full_dims,
                                                                   new.full_dims):
        raise EnsembleError(
            where + f"inconsistent shape: {_dims_text(known.full_dims)} is inferred from "
            f"model {known.model} while {_dims_text(new.full_dims)} is inferred from "
            f"model {new.model}")


def _dims_text(dims) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _tensor(model: str, batching: bool, io, use_reshape: bool = False) -> _Tensor:
    dims = tuple(io.reshape.shape) if use_reshape and io.HasField("reshape") else tuple(io.dims)
    return _Tensor(model, io.data_type, dims, _dims(dims, batching))


def check_steps(config: ModelConfig, steps: dict[str, ModelConfig]) -> bool:
    """Raise EnsembleError, with Triton's message, if a step does not fit its model:
    `steps` maps each step's model name to the config of the version it will run.
    Returns whether the ensemble is decoupled (a decoupled step is on its data flow)."""
    name = config.name
    batching = config.max_batch_size > 0
    tensors: dict[str, _Tensor] = {}
    for io in config.input:
        tensors[io.name] = _tensor(name, batching, io, True)
    for io in config.output:
        tensors.setdefault(io.name, _tensor(name, batching, io, True))
    for step in config.ensemble_scheduling.step:
        model = step.model_name
        mc = steps[model]
        if mc.max_batch_size != 0 and mc.max_batch_size < config.max_batch_size:
            raise EnsembleError(
                f"ensemble {name} allows maximum batch size {config.max_batch_size}, but "
                f"it contains model {model} which only allows maximum batch size to be "
                f"{mc.max_batch_size}")
        step_batching = mc.max_batch_size > 0
        inputs = {io.name: io for io in mc.input}
        for model_input, tensor in step.input_map.items():
            if model_input not in inputs:
                raise EnsembleError(f"in ensemble {name}, ensemble tensor {tensor} is "
                                    f"mapping to non-existing input {model_input} in "
                                    f"model {model}")
        for io in mc.input:
            tensor = step.input_map.get(io.name)
            if tensor is None:
                if io.optional:
                    continue
                raise EnsembleError(f"in ensemble {name}, input {io.name} in model {model} "
                                    "is not mapped to any ensemble tensors")
            _check_or_add(name, tensors, tensor, _tensor(model, step_batching, io))
        outputs = {io.name: io for io in mc.output}
        for model_output, tensor in step.output_map.items():
            if model_output not in outputs:
                raise EnsembleError(f"in ensemble {name}, ensemble tensor {tensor} is "
                                    f"mapped from non-existing output {model_output} in "
                                    f"model {model}")
            _check_or_add(name, tensors, tensor,
                          _tensor(model, step_batching, outputs[model_output]))
    decoupled = _decoupled_flow(config, steps, tensors)
    if decoupled and config.response_cache.enable:
        # Triton checks this before it infers the policy, then caches each response
        # of the stream as if it were the answer; refused here, in its words
        raise EnsembleError(f"Response Cache does not currently support model {name} with "
                            "'decoupled' transaction policy. Please disable the response "
                            "cache.")
    return decoupled


def _decoupled_flow(config: ModelConfig, steps: dict[str, ModelConfig],
                    tensors: dict[str, _Tensor]) -> bool:
    """Label every ensemble tensor with the decoupled step its values descend from (0:
    the request itself), as Triton's ValidateEnsembleConfig does. Each response of a
    decoupled step is a new set of tensors, so a step reading tensors of two labels
    could never pair them: refused. The ensemble is decoupled, whatever its config
    says, exactly when some decoupled step is reached (Triton overwrites the policy)."""
    labels = {io.name: 0 for io in config.input}
    pending = list(config.ensemble_scheduling.step)
    fresh = 0
    while pending:
        ready = [s for s in pending if all(t in labels for t in s.input_map.values())]
        if not ready:
            break  # the rest never runs (repository/config.py reports the broken data flow)
        for step in ready:
            pending.remove(step)
            found = {labels[t] for t in step.input_map.values()}
            if len(found) > 1:
                # Triton names the model its output tensor was first inferred from
                # (the ensemble itself for an ensemble output), as the real one does
                named = [tensors[t].model for t in step.output_map.values() if t in tensors]
                raise EnsembleError(f"in ensemble {config.name}, step of model "
                                    f"'{named[0] if named else step.model_name}' receives "
                                    "inputs originated from different decoupled models")
            label = found.pop() if found else 0
            if steps[step.model_name].model_transaction_policy.decoupled:
                fresh += 1
                label = fresh
            for tensor in step.output_map.values():
                labels.setdefault(tensor, label)
    return fresh > 0


def _check_or_add(ensemble: str, tensors: dict, name: str, new: _Tensor) -> None:
    known = tensors.get(name)
    if known is None:
        tensors[name] = new
    else:
        _consistent(ensemble, name, known, new)
