"""Model repositories for the batcher rule tests, built from one probe model.

Every model here is `probe_model.py` (it reports which execute() call and instance ran
a request, and when) under a config that turns on one rule of Triton's dynamic batcher,
instance groups or rate limiter. `build(path, names)` writes a repository Triton itself
can serve as well, which is how these configs were checked against Triton 2.51.
"""

from __future__ import annotations

import shutil
from pathlib import Path

PROBE = Path(__file__).with_name("probe_model.py")

_IO = """
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "CALL" data_type: TYPE_INT64 dims: [ 1 ] },
  { name: "IN_CALL" data_type: TYPE_INT64 dims: [ 1 ] },
  { name: "INSTANCE" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "SPAN" data_type: TYPE_FP64 dims: [ 2 ] }
]
"""

_ONE_CPU = 'instance_group [ { count: 1 kind: KIND_CPU } ]'
_FROM_INPUT = 'parameters { key: "DELAY_FROM_INPUT" value: { string_value: "1" } }'

# name -> the config lines besides name, backend and I/O
CONFIGS = {
    # two priority levels, the lower one the default; two requests per batch
    "prio": f"""max_batch_size: 2
dynamic_batching {{ priority_levels: 2 default_priority_level: 2 }}
{_ONE_CPU}""",
    # preferred size 2 sends at once, long before the 30 s delay
    "preferred": f"""max_batch_size: 8
dynamic_batching {{ preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 30000000 }}
{_ONE_CPU}""",
    # equal shapes: a request of another shape cuts the batch
    "shapes": f"""max_batch_size: 8
dynamic_batching {{ }}
{_ONE_CPU}""",
    # an optional input: requests batch only with requests carrying the same inputs
    "optional": f"""max_batch_size: 8
dynamic_batching {{ }}
{_ONE_CPU}""",
    # a partial batch waits for max_queue_delay, then goes as it is
    "queue_delay": f"""max_batch_size: 8
dynamic_batching {{ max_queue_delay_microseconds: 1500000 }}
{_ONE_CPU}""",
    # one request may wait; more are refused
    "qfull": f"""max_batch_size: 1
dynamic_batching {{ default_queue_policy {{ max_queue_size: 1 }} }}
{_ONE_CPU}
{_FROM_INPUT}""",
    # a request waiting more than 0.5 s is rejected
    "qreject": f"""max_batch_size: 1
dynamic_batching {{ default_queue_policy {{ timeout_action: REJECT
                                            default_timeout_microseconds: 500000 }} }}
{_ONE_CPU}
{_FROM_INPUT}""",
    # a request past its (overridden) timeout waits behind every unexpired one
    "qdelay": f"""max_batch_size: 1
dynamic_batching {{ default_queue_policy {{ timeout_action: DELAY
                                            default_timeout_microseconds: 30000000
                                            allow_timeout_override: true }} }}
{_ONE_CPU}
{_FROM_INPUT}""",
    # responses in request order across two instances
    "ordered": f"""max_batch_size: 1
dynamic_batching {{ preserve_ordering: true }}
instance_group [ {{ count: 2 kind: KIND_CPU }} ]
{_FROM_INPUT}""",
    "unordered": f"""max_batch_size: 1
dynamic_batching {{ }}
instance_group [ {{ count: 2 kind: KIND_CPU }} ]
{_FROM_INPUT}""",
    # three groups: a named pair, a single, and a passive one never scheduled
    "groups": """max_batch_size: 0
instance_group [
  { name: "pair" count: 2 kind: KIND_CPU },
  { count: 1 kind: KIND_CPU },
  { name: "standby" count: 1 kind: KIND_CPU passive: true }
]""",
    # both need the one resource R: under --rate-limit=execution_count with
    # --rate-limit-resource=R:1 they never run at once
    "rl_a": """max_batch_size: 0
instance_group [ { count: 1 kind: KIND_CPU
                   rate_limiter { resources [ { name: "R" count: 1 } ] } } ]
parameters { key: "EXECUTE_DELAY_MS" value: { string_value: "600" } }""",
    "rl_b": """max_batch_size: 0
instance_group [ { count: 1 kind: KIND_CPU
                   rate_limiter { resources [ { name: "R" count: 1 } ] } } ]
parameters { key: "EXECUTE_DELAY_MS" value: { string_value: "600" } }""",
    # for the wire checks of priority and timeout: no levels, no batcher
    "wire": f"""max_batch_size: 0
{_ONE_CPU}""",
    # a slow model for stopping with work queued
    "slow": f"""max_batch_size: 1
dynamic_batching {{ }}
{_ONE_CPU}
parameters {{ key: "EXECUTE_DELAY_MS" value: {{ string_value: "300" }} }}""",
}


_EXTRA_INPUT = {
    "optional": 'input [ { name: "INPUT1" data_type: TYPE_FP32 dims: [ -1 ] optional: true } ]',
}


def build(root: Path, names) -> Path:
    root = Path(root)
    for name in names:
        model = root / name
        (model / "1").mkdir(parents=True, exist_ok=True)
        shutil.copy(PROBE, model / "1" / "model.py")
        (model / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\n{CONFIGS[name]}\n{_IO}\n'
            f'{_EXTRA_INPUT.get(name, "")}\n')
    return root
