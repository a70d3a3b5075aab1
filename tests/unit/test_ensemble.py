"""The ensemble scheduler as a pure state machine: a fake host takes the step requests
it submits and the tests answer them, so each rule is checked without processes."""

import pytest
from google.protobuf import text_format
from tritonclient.grpc.model_config_pb2 import ModelConfig

from scheduler.config import ConfigError, normalize, validate
from scheduler.ensemble import EnsembleError, EnsembleScheduler, check_steps
from shm.errors import ErrorCode, InferError
from shm.messages.frontend import InferRequest, RequestedOutput
from shm.messages.results import InferResponse
from shm.messages.worker import BatchDone
from shm.tensor import TensorRef

SCHED = "ipc:///run/scheduler"


def config(text: str) -> ModelConfig:
    c = normalize(text_format.Parse(text, ModelConfig()))
    validate(c)
    return c


def io(kind, name, dims="[ 16 ]", dtype="TYPE_FP32"):
    return f'{kind} [{{ name: "{name}" data_type: {dtype} dims: {dims} }}] '


def step(model, inputs: dict, outputs: dict, version=-1):
    ins = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    outs = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: {version} {ins} {outs} }}'


def ensemble(steps, inputs=("IN",), outputs=("OUT",), mbs=8):
    text = f'name: "ens" platform: "ensemble" max_batch_size: {mbs} '
    text += "".join(io("input", n) for n in inputs) + "".join(io("output", n) for n in outputs)
    return config(text + "ensemble_scheduling { step [ " + ", ".join(steps) + " ] }")


def model(name, inputs=("INPUT0",), outputs=("OUTPUT0",), mbs=8, dims="[ 16 ]",
          dtype="TYPE_FP32", extra=""):
    text = f'name: "{name}" backend: "python" max_batch_size: {mbs} '
    text += "".join(io("input", n, dims, dtype) for n in inputs)
    text += "".join(io("output", n, dims, dtype) for n in outputs)
    return config(text + extra)


# A -> T -> B, and T -> C: a chain with a parallel branch reading one block twice
DIAMOND = ensemble([
    step("a", {"INPUT0": "IN"}, {"OUTPUT0": "T"}),
    step("b", {"INPUT0": "T"}, {"OUTPUT0": "OUT_B"}),
    step("c", {"INPUT0": "T"}, {"OUTPUT0": "OUT_C"}),
], outputs=("OUT_B", "OUT_C"))


class FakeHost:
    address = SCHED

    def __init__(self, refuse=()):
        self.ids = iter(range(100, 10_000))
        self.submitted: list[InferRequest] = []
        self.routes = {}
        self.refuse = set(refuse)
        self.finished: list[tuple[InferRequest, InferResponse, dict]] = []
        self.released: list[tuple[str, tuple[str, int]]] = []
        self.cancelled: list[int] = []

    def submit(self, owner, req):
        if req.model in self.refuse:
            raise InferError(ErrorCode.UNAVAILABLE, f"model '{req.model}' is not ready")
        req.id, req.reply_to = next(self.ids), self.address
        self.routes[req.id] = owner
        self.submitted.append(req)

    def forget(self, request_id):
        self.routes.pop(request_id, None)

    def cancel(self, request_id):
        self.cancelled.append(request_id)

    def finish(self, req, response, lent):
        self.finished.append((req, response, lent))

    def release(self, owner, blocks):
        self.released.extend((owner, b) for b in blocks)

    def running(self, model):
        return [r for r in self.submitted if r.model == model]


def client_request(**kw):
    inp = TensorRef("IN", "FP32", [1, 16], segment="fe-seg", offset=0, nbytes=64)
    return InferRequest(7, "ipc:///run/frontend0", "ens", 0, [inp], start_ns=1, **kw)


def answer(sched, req, owner="ipc:///run/worker-a", offset=0, error="", now=10):
    """The step's worker answers: each requested output as a block of its arena."""
    if error:
        sched.on_response(InferResponse(req.id, error=error,
                                        error_code=int(ErrorCode.INTERNAL)), now)
        return
    outs = [TensorRef(o.name, "FP32", [1, 16], segment=f"{owner}-seg", offset=offset + i,
                      nbytes=64) for i, o in enumerate(req.outputs)]
    sched.on_response(InferResponse(req.id, outputs=outs, owner=owner), now)


def ran(sched, req, phases=(0, 10, 30, 60)):
    sched.step_ran(req.id, BatchDone(1, "inst", *phases))


def test_steps_run_as_soon_as_their_inputs_exist_and_branches_run_together():
    """Rule: a step starts once every tensor it reads exists; independent steps are
    submitted together, not one after another."""
    host = FakeHost()
    sched = EnsembleScheduler("ens", 1, DIAMOND, host)
    sched.enqueue(client_request(), 5)
    assert [r.model for r in host.submitted] == ["a"]  # b and c wait for T
    (a,) = host.submitted
    assert [t.name for t in a.inputs] == ["INPUT0"] and a.inputs[0].segment == "fe-seg"
    answer(sched, a)
    assert sorted(r.model for r in host.submitted) == ["a", "b", "c"]
    b, c = host.running("b")[0], host.running("c")[0]
    # both read A's output block in place: the same segment and offset, renamed
    assert b.inputs[0].segment == c.inputs[0].segment == "ipc:///run/worker-a-seg"
    assert b.inputs[0].name == c.inputs[0].name == "INPUT0"
    assert host.finished == []


def test_a_block_read_by_two_steps_is_released_once_both_answered():
    """Rule: an intermediate block feeding several steps goes back to its owner only
    when its last reader is done, and exactly once."""
    host = FakeHost()
    sched = EnsembleScheduler("ens", 1, DIAMOND, host)
    sched.enqueue(client_request(), 5)
    answer(sched, host.submitted[0])  # T at worker-a offset 0
    t_block = ("ipc:///run/worker-a", ("ipc:///run/worker-a-seg", 0))
    answer(sched, host.running("b")[0], owner="ipc:///run/worker-b")
    assert t_block not in host.released  # c still reads it
    answer(sched, host.running("c")[0], owner="ipc:///run/worker-c")
    assert host.released.count(t_block) == 1
    (req, resp, lent), = host.finished
    assert not resp.error
    assert [o.name for o in resp.outputs] == ["OUT_B", "OUT_C"]
    # the final outputs are lent to the client, not released here
    assert lent == {("ipc:///run/worker-b-seg", 0): "ipc:///run/worker-b",
                    ("ipc:///run/worker-c-seg", 0): "ipc:///run/worker-c"}
    assert all(b[0] != "ipc:///run/worker-b" and b[0] != "ipc:///run/worker-c"
               for b in host.released)


def test_outputs_the_client_did_not_ask_for_are_released_and_not_sent():
    """Rule: the client's requested outputs are the response; other ensemble outputs
    are given back to their owners."""
    host = FakeHost()
    sched = EnsembleScheduler("ens", 1, DIAMOND, host)
    sched.enqueue(client_request(outputs=[RequestedOutput("OUT_C")]), 5)
    answer(sched, host.submitted[0])
    answer(sched, host.running("b")[0], owner="ipc:///run/worker-b")
    answer(sched, host.running("c")[0], owner="ipc:///run/worker-c")
    (_, resp, lent), = host.finished
    assert [o.name for o in resp.outputs] == ["OUT_C"]
    assert ("ipc:///run/worker-b", ("ipc:///run/worker-b-seg", 0)) in host.released
    assert list(lent.values()) == ["ipc:///run/worker-c"]


def test_a_failing_step_fails_the_request_naming_the_step_after_running_steps_end():
    """Rule: a failing step fails the ensemble request with Triton's "in ensemble"
    prefix and the step's model; the answer waits for steps still running, and every
    block is given back."""
    host = FakeHost()
    sched = EnsembleScheduler("ens", 1, DIAMOND, host)
    sched.enqueue(client_request(), 5)
    answer(sched, host.submitted[0])
    answer(sched, host.running("b")[0], error="negative input")
    assert host.finished == []  # c still runs
    answer(sched, host.running("c")[0], owner="ipc:///run/worker-c")
    (_, resp, _), = host.finished
    assert resp.error == "in ensemble 'ens', step 1 (model 'b'): negative input"
    assert resp.error_code == int(ErrorCode.INTERNAL)
    released = {b for _, b in host.released}
    assert released == {("ipc:///run/worker-a-seg", 0), ("ipc:///run/worker-c-seg", 0)}
    assert sched.stats.fail_count == 1 and sched.stats.success_count == 0
    assert not sched.active and not host.routes


def test_a_failure_starts_no_further_step():
    """Rule: after a step failed, steps waiting for its outputs never start."""
    host = FakeHost()
    sched = EnsembleScheduler("ens", 1, DIAMOND, host)
    sched.enqueue(client_request(), 5)
    answer(sched, host.submitted[0], error="boom")
    assert [r.model for r in host.submitted] == ["a"]
    (_, resp, _), = host.finished
    assert "step 0 (model 'a'): boom" in resp.error


def test_a_step_whose_model_is_not_ready_fails_the_request():
    """Rule: a step refused by its model (not ready) fails the request, naming it."""
    host = FakeHost(refuse={"a"})
    sched = EnsembleScheduler("ens", 1, DIAMOND, host)
    sched.enqueue(client_request(), 5)
    (_, resp, _), = host.finished
    assert resp.error == "in ensemble 'ens', step 0 (model 'a'): model 'a' is not ready"
    assert resp.error_code == int(ErrorCode.UNAVAILABLE)


def test_sequence_fields_priority_and_client_regions_flow_to_the_steps():
    """Rule: correlation id and sequence flags go to every step (stateful steps need
    them); an ensemble output the client wants in its region is written there by the
    step that makes it."""
    host = FakeHost()
    sched = EnsembleScheduler("ens", 1, DIAMOND, host)
    target = TensorRef("OUT_C", "FP32", [], segment="/client", offset=128, nbytes=64, region=3)
    sched.enqueue(client_request(sequence_id="seq-1", sequence_start=True, priority=2,
                                 outputs=[RequestedOutput("OUT_C", target=target)]), 5)
    a = host.submitted[0]
    assert (a.sequence_id, a.sequence_start, a.sequence_end, a.priority) == ("seq-1", True,
                                                                               False, 2)
    answer(sched, a)
    c = host.running("c")[0]
    assert c.outputs[0].name == "OUTPUT0" and c.outputs[0].target == target
    assert host.running("b")[0].outputs[0].target is None


def test_statistics_count_the_request_once_with_its_steps_compute_summed():
    """Rule (Triton's ensemble statistics): one success and one execution per request,
    compute phases summed over its steps, whether a step's BatchDone comes before or
    after its response."""
    host = FakeHost()
    sched = EnsembleScheduler("ens", 1, DIAMOND, host)
    sched.enqueue(client_request(batch_size=1), 5)
    a = host.submitted[0]
    ran(sched, a)  # BatchDone before the response (relayed responses)
    answer(sched, a)
    b, c = host.running("b")[0], host.running("c")[0]
    answer(sched, b)
    answer(sched, c, now=100)
    assert host.finished and sched.stats.success_count == 0  # two timings still due
    ran(sched, b)
    ran(sched, c)
    st = sched.stats
    assert (st.success_count, st.execution_count, st.inference_count) == (1, 1, 1)
    assert (st.compute_input_ns, st.compute_infer_ns, st.compute_output_ns) == (30, 60, 90)
    assert st.success_ns == 100 - 1
    assert list(st.batches) == [1]
    assert not host.routes and not sched.runs


def test_cancel_drops_queued_steps_and_answers_once_they_end():
    """Rule: a cancelled ensemble request cancels its steps; its answer is CANCELLED."""
    host = FakeHost()
    sched = EnsembleScheduler("ens", 1, DIAMOND, host)
    req = client_request()
    sched.enqueue(req, 5)
    a = host.submitted[0]
    assert sched.cancel(req.reply_to, req.id, 6)
    assert host.cancelled == [a.id]
    sched.on_response(InferResponse(a.id, error="request was cancelled",
                                    error_code=int(ErrorCode.CANCELLED)), 7)
    (_, resp, _), = host.finished
    assert resp.error_code == int(ErrorCode.CANCELLED)
    assert not sched.cancel(req.reply_to, req.id, 8)


# -- load-time checks ------------------------------------------------------------------


def test_graph_checks_use_tritons_messages():
    """Rule: the data flow is checked at load: tensors never produced, unused tensors,
    cycles, a tensor written twice (ValidateEnsembleSchedulingConfig)."""
    def rejects(steps, message, **kw):
        with pytest.raises(ConfigError) as e:
            ensemble(steps, **kw)
        assert str(e.value) == message

    # (Triton's text, stray quote included)
    rejects([step("a", {"INPUT0": "IN"}, {"OUTPUT0": "T"})],
            "ensemble output 'OUT' for ensemble ens' is not used")
    rejects([step("a", {"INPUT0": "IN"}, {"OUTPUT0": "T"}),
             step("b", {"INPUT0": "X"}, {"OUTPUT0": "OUT"})],
            "output 'OUT' for ensemble 'ens' is not written: at least one of its depending "
            "tensors, 'X', is not connected")
    # a cycle: T1 needs T2 which needs T1
    rejects([step("a", {"INPUT0": "IN", "INPUT1": "T2"}, {"OUTPUT0": "T1"}),
             step("b", {"INPUT0": "T1"}, {"OUTPUT0": "T2"}),
             step("c", {"INPUT0": "T2"}, {"OUTPUT0": "OUT"})],
            "output 'OUT' for ensemble 'ens' is not written: at least one of its depending "
            "tensors, 'T1', is not connected")
    rejects([step("a", {"INPUT0": "IN"}, {"OUTPUT0": "OUT", "OUTPUT1": "SPARE"})],
            "ensemble tensor 'SPARE' is unused in ensemble 'ens'")
    rejects([step("a", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}),
             step("b", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})],
            "ensemble tensor 'OUT' can appear in an output map only once for ensemble "
            "'ens' step 1")
    rejects([step("a", {"INPUT0": "T"}, {"OUTPUT0": "OUT"})],
            "ensemble input 'IN' for ensemble ens' is not used")


def test_step_checks_against_the_step_models_configs():
    """Rule: once the step models are loaded, each step must fit its model: inputs and
    outputs that exist, every input mapped, consistent types and shapes, batch sizes
    (ValidateEnsembleConfig's messages)."""
    chain = ensemble([step("a", {"INPUT0": "IN"}, {"OUTPUT0": "T"}),
                      step("b", {"INPUT0": "T"}, {"OUTPUT0": "OUT"})])
    check_steps(chain, {"a": model("a"), "b": model("b")})

    def rejects(steps, message, ens=chain):
        with pytest.raises(EnsembleError) as e:
            check_steps(ens, steps)
        assert str(e.value) == message

    rejects({"a": model("a", dtype="TYPE_INT32"), "b": model("b")},
            "in ensemble ens, ensemble tensor IN: inconsistent data type: TYPE_FP32 is "
            "inferred from model ens while TYPE_INT32 is inferred from model a")
    rejects({"a": model("a"), "b": model("b", dims="[ 8 ]")},
            "in ensemble ens, ensemble tensor T: inconsistent shape: [-1,16] is inferred "
            "from model a while [-1,8] is inferred from model b")
    rejects({"a": model("a", inputs=("X",)), "b": model("b")},
            "in ensemble ens, ensemble tensor IN is mapping to non-existing input INPUT0 "
            "in model a")
    rejects({"a": model("a", inputs=("INPUT0", "INPUT1")), "b": model("b")},
            "in ensemble ens, input INPUT1 in model a is not mapped to any ensemble tensors")
    rejects({"a": model("a", outputs=("Y",)), "b": model("b")},
            "in ensemble ens, ensemble tensor T is mapped from non-existing output OUTPUT0 "
            "in model a")
    rejects({"a": model("a", mbs=4), "b": model("b")},
            "ensemble ens allows maximum batch size 8, but it contains model a which only "
            "allows maximum batch size to be 4")
    # a non-batching step with the batch dimension written out fits a batching one
    check_steps(chain, {"a": model("a", mbs=0, dims="[ -1, 16 ]"), "b": model("b")})
