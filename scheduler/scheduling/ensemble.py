"""Triton's ensemble scheduler: a model made of other models' steps.

An ensemble has no instances and no worker. Each request runs as a data flow: a step
is submitted to its model's own scheduler as soon as every ensemble tensor it reads
exists, so independent steps run at the same time. The scheduler process is the
requester of every step (its inbox gets the responses), and tensors move between
steps as descriptors: a step's output block stays in the arena of the worker that
wrote it and the next step's worker reads it in place, so nothing is copied on the
way and the bytes never pass through a frontend.

A block feeds any number of steps (and maybe the client), so it is reference counted
here: it goes back to its owner (ReleaseBlocks) once every step reading it has
answered. The ensemble's outputs go to the client as references too; the frontend
releases them to this process, which hands each block back to its worker
(`Callbacks.finish` records who owns what).

A decoupled step answers any number of times: each response is a new set of tensors
(an iteration) that runs the steps downstream of it once more, and the client gets one
response per iteration that sets all its outputs. Such an ensemble is decoupled (served
over streams only); its request is complete, with the final flag, once every step
request it started has sent its final response, which may leave zero responses.

Load-time checks of the steps against their models' configs are in
scheduler/scheduling/ensemble_checks.py (re-exported here).
"""

from __future__ import annotations

import dataclasses

import msgspec
from tritonclient.grpc.model_config_pb2 import ModelConfig

from scheduler.scheduling.ensemble_checks import EnsembleError, check_steps  # noqa: F401
from scheduler.scheduling.interface import Callbacks
from scheduler.scheduling.queued import Queued
from scheduler.stats import CANCELED, OTHER, ModelStats
from shm.errors import ErrorCode, InferError
from shm.messages.frontend import InferRequest, RequestedOutput, RequestOrigin
from shm.messages.results import Error, InferResponse
from shm.messages.worker import BatchDone
from shm.tensor import TensorRef


@dataclasses.dataclass
class Step:
    index: int
    model: str
    version: int  # 0: the latest ready version (model_version -1)
    input_map: dict[str, str]  # model input -> ensemble tensor
    output_map: dict[str, str]  # model output -> ensemble tensor


# An ensemble tensor's value in one iteration: (tensor name, iteration). The request's
# own tensors are iteration 0; each response of a decoupled step opens a new iteration
# and a step that answers once keeps the iteration it ran in. Every step reads tensors
# of one iteration (check_steps refuses mixing labels), so a step runs once per
# iteration of its inputs, and the client gets one response per iteration that sets
# all its outputs. Triton numbers each tensor's values separately instead; an explicit
# lineage stays right when steps answer out of order.
Key = tuple[str, int]
Seq = tuple  # (sequence_id, sequence_start, sequence_end)


def _sequence(params: dict, seq: Seq) -> Seq:
    """The sequence fields a step's outputs carry to the steps reading them: those the
    step ran with, unless its response set any of the parameters sequence_id,
    sequence_start, sequence_end (Triton's ensemble scheduler reads them so that a
    decoupled step can drive a stateful one; a flag not set is then false)."""
    if not params or not any(k in params for k in ("sequence_id", "sequence_start",
                                                    "sequence_end")):
        return seq
    sid = params.get("sequence_id", seq[0])
    if isinstance(sid, bool) or not isinstance(sid, (int, str)):
        raise InferError(ErrorCode.INVALID_ARG, "expected parameter 'sequence_id' to be "
                         "TRITONSERVER_PARAMETER_INT or TRITONSERVER_PARAMETER_STRING")
    flags = []
    for name in ("sequence_start", "sequence_end"):
        value = params.get(name, False)
        if not isinstance(value, bool):
            raise InferError(ErrorCode.INVALID_ARG, f"expect parameter '{name}' to be "
                             "TRITONSERVER_PARAMETER_BOOL")
        flags.append(value)
    return (sid, *flags)


class _Block:
    """An ensemble tensor in a worker's arena, and how many readers it still has."""

    __slots__ = ("ref", "owner", "readers")

    def __init__(self, ref: TensorRef, owner: str, readers: int):
        self.ref, self.owner, self.readers = ref, owner, readers


class _Run:
    """One ensemble request in flight."""

    __slots__ = ("q", "req", "tensors", "seq", "blocks", "started", "running",
                 "iterations", "waiting", "answered", "timing_due", "timed_early", "error",
                 "compute", "end_ns", "finished", "counted", "wanted", "readers")

    def __init__(self, q: Queued):
        self.q = q  # the scheduler's record (statistics, trace); req its wire message
        self.req = q.req
        self.tensors: dict[Key, TensorRef | None] = {}  # None: an absent optional input
        # the sequence fields (id, start, end) that came with each step output: a
        # step reading one runs with them instead of the request's (see _sequence)
        self.seq: dict[Key, Seq] = {}
        self.blocks: dict[Key, _Block] = {}  # tensors written by steps, in arenas
        self.started: set[tuple[int, int]] = set()  # (step, iteration) submitted
        # step request id -> (step, iteration, the sequence fields it ran with)
        self.running: dict[int, tuple[int, int, Seq]] = {}
        self.iterations = 0  # the last iteration opened
        self.waiting: list[int] = []  # iterations with every output set, to answer
        self.answered = 0  # responses the client got
        # step ids that answered but whose BatchDone is still to come, and those
        # whose BatchDone came before their final response (responses may be relayed)
        self.timing_due: set[int] = set()
        self.timed_early: set[int] = set()
        self.error: Error | None = None  # the client's answer once a step failed
        self.compute = [0, 0, 0]  # the steps' compute_input / infer / output, summed
        self.end_ns = 0
        self.finished = False  # the client has its final answer
        self.counted = False  # in the statistics
        self.wanted: dict[str, RequestedOutput] = {}  # ensemble outputs the client asked
        # ensemble tensor -> the steps reading it that this request runs (_Plan)
        self.readers: dict[str, tuple[int, ...]] = {}


class EnsembleScheduler:
    """The Scheduler of one ensemble version (see scheduler/scheduling/interface.py): it
    has no instances, so it is no InstanceScheduler; the loop never pumps it, and it
    is the RequestOwner of its step requests.

    `decoupled_models` names the step models that are decoupled: each of their
    responses runs the steps downstream once more. The ensemble itself is decoupled
    when its config says so (the model manager sets it from check_steps): it then
    answers once per iteration that sets its outputs, as those come, and ends with
    the final flag once every step request it started is complete."""

    def __init__(self, name: str, version: int, config: ModelConfig, callbacks: Callbacks, *,
                 histograms: bool = True, decoupled_models: frozenset[str] = frozenset()):
        self.name = name
        self.version = version
        self.config = config
        self.callbacks = callbacks  # its steps are requests of the process's own
        self.stats = ModelStats(name, version, histograms)
        self.batching = config.max_batch_size > 0
        self.decoupled = config.model_transaction_policy.decoupled
        self.steps = [Step(i, s.model_name, max(int(s.model_version), 0),
                           dict(s.input_map), dict(s.output_map))
                      for i, s in enumerate(config.ensemble_scheduling.step)]
        self.models = sorted({s.model for s in self.steps})
        self.decoupled_steps = {s.index for s in self.steps if s.model in decoupled_models}
        self.optional = {io.name for io in config.input if io.optional}
        self.outputs = [io.name for io in config.output]
        # ensemble tensor -> the steps reading it
        self.readers: dict[str, list[int]] = {}
        for step in self.steps:
            for tensor in step.input_map.values():
                self.readers.setdefault(tensor, []).append(step.index)
        self.plans: dict[frozenset[str], tuple] = {}  # see _plan
        self.runs: dict[int, _Run] = {}  # step request id -> its run
        self.active: dict[tuple[str, int], _Run] = {}  # (reply_to, id) -> run
        self.accepting = True

    # -- requests ---------------------------------------------------------------------

    def enqueue(self, q: Queued, now: int) -> None:
        req = q.req
        if not self.accepting:
            raise InferError(ErrorCode.UNAVAILABLE, (
                f"[request id: {req.request_id or '<id_unknown>'}] Server is stopping, "
                "scheduler for model has stopped accepting new inference requests"))
        q.queue_ns = now
        run = _Run(q)
        for ref in req.inputs:
            run.tensors[(ref.name, 0)] = ref
        for name in self.optional:
            run.tensors.setdefault((name, 0), None)
        if req.outputs is None:
            run.wanted = {name: RequestedOutput(name) for name in self.outputs}
        else:
            run.wanted = {o.name: o for o in req.outputs}
        self.active[(req.reply_to, req.id)] = run
        needed, run.readers = self._plan(frozenset(run.wanted))
        for step in self.steps:
            if step.index in needed and self._ready(run, step, 0):
                self._submit(run, step, 0, now)
        self._maybe_finish(run, now)

    def _plan(self, wanted: frozenset[str]) -> tuple:
        """The steps a request asking for `wanted` runs, and the readers of each
        tensor among them: the steps some wanted output depends on, directly or
        through later steps. Triton prunes the others per request (a step whose outputs nobody asked for
        does not run); a step is kept whole, even where only some of its outputs
        are needed. Cached per set of outputs (requests ask for few distinct sets)."""
        plan = self.plans.get(wanted)
        if plan is not None:
            return plan
        needed_tensors, needed = set(wanted), set()
        changed = True
        while changed:  # steps are few; a fixed point needs no topological order
            changed = False
            for step in self.steps:
                if (step.index not in needed
                        and not needed_tensors.isdisjoint(step.output_map.values())):
                    needed.add(step.index)
                    needed_tensors.update(step.input_map.values())
                    changed = True
        plan = (frozenset(needed), {tensor: tuple(i for i in readers if i in needed)
                                    for tensor, readers in self.readers.items()})
        if len(self.plans) < 64:  # bounded: the client chooses the sets
            self.plans[wanted] = plan
        return plan

    def _ready(self, run: _Run, step: Step, it: int) -> bool:
        return ((step.index, it) not in run.started
                and all((t, it) in run.tensors for t in step.input_map.values()))

    def _submit(self, run: _Run, step: Step, it: int, now: int) -> None:
        run.started.add((step.index, it))
        if run.error is not None:
            return  # a failed request starts no more steps
        req = run.req
        seq = None  # the first step output read decides, as in Triton
        inputs = []
        for model_input, tensor in step.input_map.items():
            seq = seq or run.seq.get((tensor, it))
            ref = run.tensors[(tensor, it)]
            if ref is not None:  # an optional input the client left out stays out
                inputs.append(msgspec.structs.replace(ref, name=model_input))
        seq = seq or (req.sequence_id, req.sequence_start, req.sequence_end)
        outputs = []
        for model_output, tensor in step.output_map.items():
            wanted = run.wanted.get(tensor)
            # the client's region for an ensemble output: the step writes straight there
            target = wanted.target if wanted is not None else None
            outputs.append(RequestedOutput(model_output, target=target))
        step_req = InferRequest(
            0, "", step.model, step.version, inputs, outputs, request_id=req.request_id,
            batch_size=req.batch_size, priority=req.priority, timeout_us=req.timeout_us,
            sequence_id=seq[0], sequence_start=seq[1], sequence_end=seq[2],
            parameters=req.parameters, start_ns=now,
            origin=RequestOrigin.ENSEMBLE,
            callers=req.callers)  # BLS: a step may not call back into a waiting model
        try:
            step_id = self.callbacks.submit(self, step_req)
        except InferError as exc:
            self._step_failed(run, step, exc.code, exc.message)
            self._inputs_done(run, step, it)
            return
        run.running[step_id] = (step.index, it, seq)
        self.runs[step_id] = run

    def on_response(self, msg: InferResponse, now: int) -> None:
        """A step's response came to this process's inbox (a decoupled step sends any
        number; the last carries `final`)."""
        run = self.runs.get(msg.id)
        if run is None:
            return
        where = run.running.get(msg.id)
        if where is None:
            return
        index, it, seq = where
        step = self.steps[index]
        if msg.final:
            del run.running[msg.id]
            if msg.error is not None or msg.cache_hit or msg.id in run.timed_early:
                # nothing more to hear about this step (a failure is not timed; a
                # cache hit ran no batch)
                run.timed_early.discard(msg.id)
                self.runs.pop(msg.id, None)
                self.callbacks.forget(msg.id)
            else:
                run.timing_due.add(msg.id)
        error = msg.error
        if error is None and not msg.empty:
            try:
                seq = _sequence(msg.parameters, seq)
            except InferError as exc:
                error = Error(exc.code, exc.message)
        if error is not None:
            # an error response of a decoupled step fails the request too, as in Triton
            self._step_failed(run, step, error.code, error.message)
            self._release_outputs(msg)
        elif not msg.empty:
            if index in self.decoupled_steps:
                run.iterations += 1
                it_out = run.iterations
            else:
                it_out = it
            self._outputs_ready(run, step, msg, it_out, seq, now)
        if msg.final:
            self._inputs_done(run, step, it)  # its worker has read its inputs
        self._answer_waiting(run)
        self._maybe_finish(run, now)

    def step_ran(self, request_id: int, msg: BatchDone) -> None:
        """The batch that ran a step finished: its compute phases count toward the
        ensemble's, as Triton sums its composing models' (before or after the step's
        final response arrived, whichever came first)."""
        run = self.runs.get(request_id)
        if run is None:
            return
        run.compute[0] += msg.input_end_ns - msg.compute_start_ns
        run.compute[1] += msg.output_start_ns - msg.input_end_ns
        run.compute[2] += msg.compute_end_ns - msg.output_start_ns
        if request_id in run.running:
            run.timed_early.add(request_id)  # the final response is still to come
            return
        run.timing_due.discard(request_id)
        self.runs.pop(request_id, None)
        self.callbacks.forget(request_id)
        self._maybe_count(run)

    def _outputs_ready(self, run: _Run, step: Step, msg: InferResponse, it: int,
                       seq: Seq, now: int) -> None:
        ready = []
        for ref in msg.outputs:
            tensor = step.output_map.get(ref.name)
            if tensor is None or (tensor, it) in run.tensors or run.error is not None:
                self._release_ref(ref, msg.owner)  # not asked for, or too late
                continue
            run.tensors[(tensor, it)] = ref
            run.seq[(tensor, it)] = seq
            readers = len(run.readers.get(tensor, ())) + (tensor in run.wanted)
            if ref.data is None and not ref.region:
                if readers:
                    run.blocks[(tensor, it)] = _Block(ref, msg.owner, readers)
                else:
                    self.callbacks.release(msg.owner, [(ref.segment, ref.offset)])
            ready.append(tensor)
        for tensor in ready:
            for index in run.readers.get(tensor, ()):
                if self._ready(run, self.steps[index], it):
                    self._submit(run, self.steps[index], it, now)
        if (any(t in run.wanted for t in ready)
                and all((t, it) in run.tensors for t in run.wanted)):
            run.waiting.append(it)  # this iteration set every output the client asked

    def _inputs_done(self, run: _Run, step: Step, it: int) -> None:
        for tensor in step.input_map.values():
            self._unref(run, (tensor, it))

    def _unref(self, run: _Run, key: Key) -> None:
        block = run.blocks.get(key)
        if block is None:
            return
        block.readers -= 1
        if block.readers <= 0:
            del run.blocks[key]
            self.callbacks.release(block.owner, [(block.ref.segment, block.ref.offset)])

    def _release_outputs(self, msg: InferResponse) -> None:
        for ref in msg.outputs:
            self._release_ref(ref, msg.owner)

    def _release_ref(self, ref: TensorRef, owner: str) -> None:
        if ref.data is None and not ref.region and owner:
            self.callbacks.release(owner, [(ref.segment, ref.offset)])

    def _step_failed(self, run: _Run, step: Step, code: ErrorCode, message: str) -> None:
        if run.error is None:
            # Triton prefixes "in ensemble '<name>', "; the step's model is named too,
            # so a user sees which step broke
            run.error = Error(code, f"in ensemble '{self.name}', step {step.index} "
                                    f"(model '{step.model}'): {message}")

    # -- answers --------------------------------------------------------------------------

    def _answer_waiting(self, run: _Run) -> None:
        """A decoupled ensemble answers each complete iteration while steps still run,
        in the order the iterations completed. An output block still read by a step
        of its iteration waits for that step: the client's release hands a block
        straight back to its owner, so the client must be its last reader. What is
        complete once nothing runs goes out from _maybe_finish, the last one final."""
        if not self.decoupled or run.error is not None or run.finished:
            return
        while run.waiting and run.running and self._client_only(run, run.waiting[0]):
            self._send(run, run.waiting.pop(0), final=False)

    def _client_only(self, run: _Run, it: int) -> bool:
        return all(block.readers <= 1 for block in
                   (run.blocks.get((name, it)) for name in run.wanted) if block is not None)

    def _send(self, run: _Run, it: int, final: bool) -> None:
        req = run.req
        outputs, lent = [], {}
        for name in self.outputs:
            if name not in run.wanted:
                continue
            ref = run.tensors[(name, it)]
            outputs.append(msgspec.structs.replace(ref, name=name))
            block = run.blocks.pop((name, it), None)
            if block is not None:
                lent[(ref.segment, ref.offset)] = block.owner
        run.answered += 1
        # Triton 2.51 puts the sequence fields into every ensemble response (those its
        # outputs came with: a step may have changed them), even for a request outside
        # any sequence (id 0, both flags false), on every protocol
        seq = next((run.seq[(name, it)] for name in run.wanted if (name, it) in run.seq),
                   (req.sequence_id, req.sequence_start, req.sequence_end))
        params = {"sequence_id": seq[0], "sequence_start": seq[1], "sequence_end": seq[2]}
        self.callbacks.finish(run.q, InferResponse(req.id, outputs=outputs, final=final,
                                            model_version=self.version,
                                            parameters=params), lent)

    def _maybe_finish(self, run: _Run, now: int) -> None:
        """Answer the client for the last time once no step runs and none can start."""
        if run.finished or run.running:
            return
        run.finished = True
        req = run.req
        self.active.pop((req.reply_to, req.id), None)
        if (run.error is None and not self.decoupled and not run.waiting
                and run.wanted):
            # a decoupled ensemble may answer nothing, as a decoupled model may
            run.error = Error(
                ErrorCode.INVALID_ARG,
                f"in ensemble '{self.name}', [request id: "
                f"{req.request_id or '<id_unknown>'}] unexpected deadlock, at least one "
                "output is not set while no more ensemble steps can be made")
        if run.error is not None:
            self._release_all(run)
            self.stats.failed(run.q, CANCELED if run.error.code == ErrorCode.CANCELLED
                              else OTHER, now)
            self.callbacks.finish(run.q, InferResponse(req.id, error=run.error), {})
            for step_id in [i for i, r in self.runs.items() if r is run]:
                self.runs.pop(step_id)
                self.callbacks.forget(step_id)
            return
        # every step has answered: the client is the last reader of what it gets
        if not self.decoupled and not run.waiting:
            run.waiting.append(0)  # the client asked for no outputs: an empty answer
        if run.waiting:
            while run.waiting:
                it = run.waiting.pop(0)
                self._send(run, it, final=not run.waiting)
        else:  # a decoupled ensemble with nothing more to say: the final flag alone
            self.callbacks.finish(run.q, InferResponse(req.id, empty=True,
                                                model_version=self.version), {})
        self._release_all(run)
        run.end_ns = now
        self._maybe_count(run)

    def _release_all(self, run: _Run) -> None:
        for key in list(run.blocks):
            block = run.blocks.pop(key)
            self.callbacks.release(block.owner, [(block.ref.segment, block.ref.offset)])

    def _maybe_count(self, run: _Run) -> None:
        """Count a successful request once every step's timing is in."""
        if run.finished and run.error is None and not run.timing_due and not run.counted:
            run.counted = True
            self.stats.ensemble_ran(run.q, run.req.batch_size if self.batching else 1,
                                    run.end_ns, *run.compute)

    # -- leaving ------------------------------------------------------------------------

    def cancel(self, reply_to: str, request_id: int, now: int) -> bool:
        run = self.active.get((reply_to, request_id))
        if run is None:
            return False
        if run.error is None:
            run.error = Error(ErrorCode.CANCELLED,
                              f"in ensemble '{self.name}', request was cancelled")
        for step_id in list(run.running):
            self.callbacks.cancel(step_id)
        self._maybe_finish(run, now)
        return True

    def drop_from(self, reply_to: str, now: int) -> list[Queued]:
        """The frontend `reply_to` died: its runs stop as if cancelled (their step
        requests leave the queues; a running step's outputs are released)."""
        for client, request_id in [k for k in self.active if k[0] == reply_to]:
            self.cancel(client, request_id, now)
        return []

    def begin_unload(self) -> None:
        self.accepting = False

    @property
    def drained(self) -> bool:
        return not self.active

    @property
    def pending(self) -> int:
        return 0  # requests wait in their steps' queues, counted there

    @property
    def waiting_at_instances(self) -> int:
        return 0  # likewise

    def waiting_from(self, reply_to: str) -> int:
        return 0

    def fail_all(self, code: ErrorCode, reason: str, now: int) -> None:
        # the steps' own schedulers fail what they hold, which ends each run; a run
        # still here has a step nobody will answer
        for run in list(self.active.values()):
            if run.error is None:
                run.error = Error(code, f"in ensemble '{self.name}', {reason}")
            run.running.clear()
            self._maybe_finish(run, now)

    def summary(self) -> str:
        return (f"ensemble '{self.name}' version {self.version}: "
                f"{self.stats.success_count} requests, {self.stats.fail_count} failed; "
                f"steps {', '.join(self.models)}")
