"""Model repositories for the sequence batcher tests and benchmark.

`build(root, names)` writes the named models: the python accumulator
(`acc_model.py`) under several sequence_batching configs, and an ONNX accumulator
with implicit state built by tests/onnx_models.py, and a TorchScript one built by
tests/torch_models.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

ACC = Path(__file__).with_name("acc_model.py")


def _controls(corrid_type: str = "TYPE_UINT64") -> str:
    return f"""  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid_type} }} ] }}
  ]"""


_STATE = """  state [ { input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32
            dims: [ 1 ]
            initial_state: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true
                             name: "zero" } } ]"""

_IO = """input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "START_VEC" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "READY_VEC" data_type: TYPE_INT32 dims: [ -1 ] },
  { name: "CORRID_OUT" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "CALL" data_type: TYPE_INT64 dims: [ 1 ] }
]"""


_STATE_FROM_FILE = """  state [ { input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32
            dims: [ 1 ]
            initial_state: { data_type: TYPE_INT32 dims: [ 1 ] data_file: "acc.bin"
                             name: "hundred" } } ]"""


def _python(max_batch: int, strategy: str, idle_us: int = 5_000_000,
            corrid_type: str = "TYPE_UINT64", count: int = 1, state: str = _STATE) -> str:
    return f"""backend: "python"
max_batch_size: {max_batch}
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  {strategy}
{_controls(corrid_type)}
{state}
}}
{_IO}
instance_group [ {{ count: {count} kind: KIND_CPU }} ]"""


# name -> config lines besides the name
CONFIGS = {
    # direct, two slots: the seed's timeline and interleaved sequences
    "seq_acc": _python(2, "direct { }"),
    # direct, one slot: a second sequence waits in the backlog
    "seq_acc_1slot": _python(1, "direct { }"),
    # one slot and a short idle time: the idle sequence loses its slot
    "seq_acc_idle": _python(1, "direct { }", idle_us=300_000),
    # oldest, four candidates, batches of up to 4
    "seq_acc_oldest": _python(4, "oldest { max_candidate_sequences: 4 }"),
    # string correlation ids
    "seq_acc_string": _python(2, "direct { }", corrid_type="TYPE_STRING"),
    # the initial state read from <model>/initial_state/acc.bin (100)
    "seq_acc_init": _python(2, "direct { }", state=_STATE_FROM_FILE),
    # the benchmark's model: 64 slots over two instances
    "seq_acc_bench": _python(32, "direct { }", count=2),
}

ONNX_CONFIG = """backend: "onnxruntime"
max_batch_size: 4
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  STRATEGY
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }
  ]
  state [ { input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "START_OUT" data_type: TYPE_INT32 dims: [ 1 ] }
]
instance_group [ { count: 1 kind: KIND_CPU } ]"""

ONNX = {"seq_acc_onnx": "direct { }",
        "seq_acc_onnx_oldest": "oldest { max_candidate_sequences: 4 }"}
TORCH = {"seq_acc_torch": "direct { }",
         "seq_acc_torch_oldest": "oldest { max_candidate_sequences: 4 }"}


def build(root: Path, names) -> Path:
    root = Path(root)
    for name in names:
        model = root / name
        if name in TORCH:
            from tests.torch_models import accumulator as torch_accumulator
            torch_accumulator(model, TORCH[name])
            continue
        if name in ONNX:
            from tests.onnx_models import accumulator
            config = ONNX_CONFIG.replace("STRATEGY", ONNX[name])
            accumulator(model, f'name: "{name}"\n{config}\n')
            continue
        (model / "1").mkdir(parents=True, exist_ok=True)
        shutil.copy(ACC, model / "1" / "model.py")
        (model / "config.pbtxt").write_text(f'name: "{name}"\n{CONFIGS[name]}\n')
        if "data_file" in CONFIGS[name]:
            (model / "initial_state").mkdir(exist_ok=True)
            (model / "initial_state" / "acc.bin").write_bytes(
                np.array([100], dtype=np.int32).tobytes())
    return root
