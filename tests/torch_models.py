"""Tiny TorchScript models that tests build into Triton model directories.

Each builder scripts a module with torch.jit.script, saves it as `<dir>/1/model.pt` and
writes `<dir>/config.pbtxt` (platform "pytorch_libtorch"; the model is named after the
directory, as Triton requires), and returns the directory. `config_json(dir)` reads it
back the way the scheduler does, as the JSON dict a worker receives.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch

# (name, "TYPE_FP32", dims)
Tensor = Tuple[str, str, Sequence[int]]


class AddSub(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return a + b, a - b


class AddSubByName(torch.nn.Module):
    """Argument names equal the config's input names (FORWARD_ARGUMENT naming)."""

    def forward(self, INPUT0: torch.Tensor, INPUT1: torch.Tensor
                ) -> Tuple[torch.Tensor, torch.Tensor]:
        return INPUT0 + INPUT1, INPUT0 - INPUT1


class DictInput(torch.nn.Module):
    def forward(self, inputs: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        a, b = inputs["INPUT_A"], inputs["INPUT_B"]
        return a + b, a - b


class DictOutput(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> Dict[str, torch.Tensor]:
        return {"SUM": a + b, "DIFF": a - b}


class Identity(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class Mlp(torch.nn.Module):
    def __init__(self, sizes: Sequence[int]):
        super().__init__()
        self.fc1 = torch.nn.Linear(sizes[0], sizes[1])
        self.fc2 = torch.nn.Linear(sizes[1], sizes[2])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class ModeProbe(torch.nn.Module):
    """[a fresh tensor is an inference tensor, grad mode is on], as seen inside forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fresh = x + 1
        return torch.tensor([fresh.is_inference(), torch.is_grad_enabled()])


class RaggedSums(torch.nn.Module):
    """INPUT: the requests' elements concatenated; OFFSETS: where each starts, plus the
    end (BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO); SHAPES: each batch item's shape
    without the batch dimension (BATCH_ITEM_SHAPE). Returns each request's sum, the
    negated elements (scattered back per request) and SHAPES."""

    def forward(self, INPUT: torch.Tensor, OFFSETS: torch.Tensor, SHAPES: torch.Tensor
                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        sums: List[torch.Tensor] = []
        for i in range(OFFSETS.shape[0] - 1):
            sums.append(INPUT[int(OFFSETS[i]):int(OFFSETS[i + 1])].sum())
        return torch.stack(sums).unsqueeze(1), -INPUT, SHAPES


class Upper(torch.nn.Module):
    def forward(self, text: List[str]) -> List[str]:
        return [s.upper() for s in text]


def config_text(name: str, inputs: Sequence[Tensor], outputs: Sequence[Tensor], *,
                max_batch_size: int = 8, parameters: dict[str, str] | None = None,
                extra: str = "") -> str:
    """A config.pbtxt for a TorchScript model."""

    def tensors(items):
        return ",\n".join(
            f'  {{ name: "{n}" data_type: {t} dims: [ {", ".join(str(d) for d in dims)} ] }}'
            for n, t, dims in items)

    lines = [f'name: "{name}"', 'platform: "pytorch_libtorch"',
             f"max_batch_size: {max_batch_size}",
             f"input [\n{tensors(inputs)}\n]", f"output [\n{tensors(outputs)}\n]"]
    for key, value in (parameters or {}).items():
        lines.append(f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}')
    lines.append("instance_group [ { count: 1 kind: KIND_CPU } ]")
    if extra:
        lines.append(extra)
    return "\n".join(lines) + "\n"


def save_model(model_dir, module, inputs: Sequence[Tensor], outputs: Sequence[Tensor],
               **config) -> Path:
    """Script `module` (or save an already scripted one) into a model directory."""
    model_dir = Path(model_dir)
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    scripted = module if isinstance(module, torch.jit.ScriptModule) else torch.jit.script(module)
    scripted.save(str(model_dir / "1" / "model.pt"))
    (model_dir / "config.pbtxt").write_text(
        config_text(model_dir.name, inputs, outputs, **config))
    return model_dir


def config_json(model_dir) -> dict:
    """The normalized config as JSON, as the scheduler sends it to a worker."""
    from scheduler.repository.config import config_to_json, load_config, normalize, validate

    model_dir = Path(model_dir)
    config = normalize(load_config(model_dir), model_files=["model.pt"])
    validate(config)
    return config_to_json(config)


def add_sub(model_dir, naming: str = "index", *, dims: int = 16, max_batch_size: int = 8,
            parameters: dict[str, str] | None = None) -> Path:
    """OUTPUT0 = INPUT0 + INPUT1 and OUTPUT1 = INPUT0 - INPUT1 on FP32 vectors.

    naming "index": INPUT__0, INPUT__1 -> OUTPUT__0, OUTPUT__1; "argument": INPUT0,
    INPUT1 named like forward()'s arguments -> OUTPUT0, OUTPUT1 in config order.
    """
    if naming == "index":
        module, ins, outs = AddSub(), ["INPUT__0", "INPUT__1"], ["OUTPUT__0", "OUTPUT__1"]
    elif naming == "argument":
        module, ins, outs = AddSubByName(), ["INPUT0", "INPUT1"], ["OUTPUT0", "OUTPUT1"]
    else:
        raise ValueError(f"unknown naming {naming!r}")
    return save_model(model_dir, module,
                      [(n, "TYPE_FP32", [dims]) for n in ins],
                      [(n, "TYPE_FP32", [dims]) for n in outs],
                      max_batch_size=max_batch_size, parameters=parameters)


def dict_input(model_dir, *, dims: int = 4) -> Path:
    """forward(Dict[str, Tensor]): OUTPUT__0 = INPUT_A + INPUT_B, OUTPUT__1 = A - B."""
    return save_model(model_dir, DictInput(),
                      [(n, "TYPE_FP32", [dims]) for n in ("INPUT_A", "INPUT_B")],
                      [(n, "TYPE_FP32", [dims]) for n in ("OUTPUT__0", "OUTPUT__1")])


def dict_output(model_dir, *, dims: int = 4) -> Path:
    """Returns {"SUM": a + b, "DIFF": a - b}; the config lists DIFF first."""
    return save_model(model_dir, DictOutput(),
                      [(n, "TYPE_FP32", [dims]) for n in ("INPUT__0", "INPUT__1")],
                      [(n, "TYPE_FP32", [dims]) for n in ("DIFF", "SUM")])


def identity(model_dir, data_type: str = "TYPE_FP32", *, dims: Sequence[int] = (-1,),
             max_batch_size: int = 8, parameters: dict[str, str] | None = None,
             scripted=None) -> Path:
    """OUTPUT__0 = INPUT__0 of any datatype; `scripted` reuses a scripted Identity."""
    return save_model(model_dir, scripted if scripted is not None else Identity(),
                      [("INPUT__0", data_type, dims)], [("OUTPUT__0", data_type, dims)],
                      max_batch_size=max_batch_size, parameters=parameters)


def mlp(model_dir, sizes: Sequence[int] = (512, 2048, 512), *, max_batch_size: int = 64,
        seed: int = 0, extra: str = "") -> Path:
    """Linear(512, 2048) -> ReLU -> Linear(2048, 512) on FP32, seeded weights."""
    torch.manual_seed(seed)
    return save_model(model_dir, Mlp(sizes), [("INPUT__0", "TYPE_FP32", [sizes[0]])],
                      [("OUTPUT__0", "TYPE_FP32", [sizes[2]])],
                      max_batch_size=max_batch_size, extra=extra)


def mlp_reference(model_dir, x: np.ndarray) -> np.ndarray:
    """The MLP's output computed in numpy (float64) from the saved weights."""
    state = torch.jit.load(str(Path(model_dir) / "1" / "model.pt")).state_dict()
    w = {k: v.detach().numpy().astype(np.float64) for k, v in state.items()}
    hidden = np.maximum(x.astype(np.float64) @ w["fc1.weight"].T + w["fc1.bias"], 0.0)
    return hidden @ w["fc2.weight"].T + w["fc2.bias"]


def mode_probe(model_dir, inference_mode: str | None = None) -> Path:
    """BOOL OUTPUT__0 = [inference mode on, grad mode on] inside forward()."""
    parameters = {"INFERENCE_MODE": inference_mode} if inference_mode is not None else None
    return save_model(model_dir, ModeProbe(), [("INPUT__0", "TYPE_FP32", [1])],
                      [("OUTPUT__0", "TYPE_BOOL", [2])], max_batch_size=0,
                      parameters=parameters)


def string_upper(model_dir) -> Path:
    """List[str] in, upper-cased List[str] out (Triton: 1-D strings, no batching)."""
    return save_model(model_dir, Upper(), [("TEXT__0", "TYPE_STRING", [-1])],
                      [("UPPER__0", "TYPE_STRING", [-1])], max_batch_size=0)


RAGGED_SUMS_CONFIG = """
name: "{name}"
platform: "pytorch_libtorch"
max_batch_size: 8
dynamic_batching {{ }}
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }} ]
batch_input [
  {{ kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "OFFSETS"
     data_type: TYPE_INT32 source_input: "INPUT" }},
  {{ kind: BATCH_ITEM_SHAPE target_name: "SHAPES" data_type: TYPE_INT32
     source_input: "INPUT" }}
]
output [
  {{ name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "NEG" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "SHAPE_OUT" data_type: TYPE_INT32 dims: [ 1 ] }}
]
batch_output [
  {{ target_name: "NEG" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "INPUT" }}
]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


def ragged_sums(model_dir) -> Path:
    """RaggedSums served with ragged batching (RAGGED_SUMS_CONFIG, named after the
    directory): SUM per request, NEG scattered back in each request's input shape,
    SHAPE_OUT each item's length."""
    model_dir = Path(model_dir)
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    torch.jit.script(RaggedSums()).save(str(model_dir / "1" / "model.pt"))
    (model_dir / "config.pbtxt").write_text(RAGGED_SUMS_CONFIG.format(name=model_dir.name))
    return model_dir


def build_e2e_models(root) -> list[str]:
    """The TorchScript models the end-to-end tests serve, under `root`; their names:
    torch_add_sub (INPUT__0/INPUT__1 -> OUTPUT__0/OUTPUT__1), torch_add_sub_by_name
    (INPUT0/INPUT1 -> OUTPUT0/OUTPUT1), torch_dict_input, torch_identity (FP32 [-1]),
    torch_mlp (dynamic batching, up to 64 rows) and torch_strings (1-D TYPE_STRING)."""
    root = Path(root)
    add_sub(root / "torch_add_sub", naming="index")
    add_sub(root / "torch_add_sub_by_name", naming="argument")
    dict_input(root / "torch_dict_input")
    identity(root / "torch_identity")
    mlp(root / "torch_mlp", extra="dynamic_batching { max_queue_delay_microseconds: 2000 }")
    string_upper(root / "torch_strings")
    return ["torch_add_sub", "torch_add_sub_by_name", "torch_dict_input", "torch_identity",
            "torch_mlp", "torch_strings"]


class Accumulator(torch.nn.Module):
    """A stateful accumulator for the sequence batcher: OUTPUT__0 = ACC_IN__2 +
    INPUT__0, ACC_OUT__1 (the implicit state's output) the same, START__1 the control."""

    def forward(self, x: torch.Tensor, start: torch.Tensor, acc: torch.Tensor
                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        total = acc + x
        return total, total, start


def accumulator(model_dir, strategy: str = "direct { }") -> Path:
    """The Accumulator with sequence_batching (`strategy`), a START control (int32) and
    an INT32 state; max_batch_size 4."""
    extra = f"""sequence_batching {{
  max_sequence_idle_microseconds: 5000000
  {strategy}
  control_input [
    {{ name: "START__1" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }}
  ]
  state [ {{ input_name: "ACC_IN__2" output_name: "ACC_OUT__1" data_type: TYPE_INT32
            dims: [ 1 ] }} ]
}}"""
    return save_model(model_dir, Accumulator(), [("INPUT__0", "TYPE_INT32", [1])],
                      [("OUTPUT__0", "TYPE_INT32", [1]), ("START_OUT__2", "TYPE_INT32", [1])],
                      max_batch_size=4, extra=extra)
