"""Per-model-version statistics, counted by Triton's rules (core `infer_stats.cc`).

Everything here is counters updated once per batch from the BatchDone a worker sends,
with timestamps taken where Triton takes them, each in the process where the phase
happens (CLOCK_MONOTONIC is one clock for every process of the machine):
- request start: the frontend, once the request is parsed and valid (InferAsync);
- queue start: the scheduler, when the request enters the model's queue;
- compute start, input end, output start, compute end: the worker, around the batch;
  the end of compute is also the request's end, as backends report it.
So statistics cost no message of their own.

Rules:
- success: count and total request duration (end - request start); queue: for
  successes, compute start - queue start; compute_input/infer/output: for successes,
  the batch's phases;
- inference_count adds each successful request's batch size (at least 1);
  execution_count and batch_stats count executions, keyed by the batch's total size;
- fail: requests that failed after reaching the model's scheduler, with the reason
  Triton reports in `nv_inference_request_failure`: REJECTED (queue timeout),
  CANCELED, BACKEND (the model's execution failed), OTHER (e.g. the instance died).
  Requests refused before that (unknown model, bad input, a full queue) count
  nowhere, as in Triton.
- the response cache (core `UpdateSuccessCacheHit` / `UpdateSuccessCacheMiss`): a hit
  is a success (count, request duration, and queue up to its lookup) and a cache_hit
  (its lookup time), with no inference_count, execution or compute; a miss that ran
  successfully is a cache_miss timed as lookup + insertion, and the insertion, which
  happens after the request's end, is added to its request duration too.
"""

from __future__ import annotations

import bisect
import collections
import time
from array import array

from shm.messages.worker import RESPONSE_STATS_INDICES

REJECTED, CANCELED, BACKEND, OTHER = "REJECTED", "CANCELED", "BACKEND", "OTHER"
FAILURE_REASONS = (REJECTED, CANCELED, BACKEND, OTHER)

# Histogram bucket bounds in milliseconds. Triton's first-response histogram defaults to
# 100/500/2000/5000 ms, too coarse for a p99 of a sub-millisecond server.
HISTOGRAM_BUCKETS_MS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0,
                        500.0, 1000.0, 2500.0, 5000.0)


class Histogram:
    """Bucket counts and a sum, as Prometheus histograms carry them."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds=HISTOGRAM_BUCKETS_MS):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def observe_request(self, first: "Histogram", queue: "Histogram", total_ms: float,
                        queue_ms: float) -> None:
        """A request's three observations, in one call on the scheduler's path: its
        duration here and in `first` (a non-decoupled request's first response is
        its last), its queue time in `queue`; all three share these bounds."""
        bounds = self.bounds
        k = bisect.bisect_left(bounds, total_ms)
        self.counts[k] += 1
        self.sum += total_ms
        first.counts[k] += 1
        first.sum += total_ms
        queue.counts[bisect.bisect_left(bounds, queue_ms)] += 1
        queue.sum += queue_ms

    def cumulative(self) -> list[tuple[str, int]]:
        out, total = [], 0
        for bound, count in zip(self.bounds + (float("inf"),), self.counts):
            total += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), total))
        return out


class BatchStat:
    __slots__ = ("count", "input_ns", "infer_ns", "output_ns")

    def __init__(self):
        self.count = self.input_ns = self.infer_ns = self.output_ns = 0


class ResponseTable:
    """Triton's InferResponseStatistics by response index: a column of counters per
    field, as long as the largest index seen. 8 bytes a field and index, where an
    object per index with its own ints took about 450 bytes (65,536 indices: ~5 MiB,
    not ~29)."""

    FIELDS = ("infer_count", "infer_ns", "output_count", "output_ns", "success_count",
              "success_ns", "fail_count", "fail_ns", "empty_count", "empty_ns")
    __slots__ = FIELDS + ("size",)

    def __init__(self):
        for name in self.FIELDS:
            setattr(self, name, array("q"))
        self.size = 0

    def add(self, index: int, kind: int, start: int, output_start: int,
            end: int) -> None:
        """One response: compute_infer from its start (the previous one's end) to its
        output, compute_output from there to its end; success and fail take both, an
        empty response (kind 2) its infer time only; kind 1 failed."""
        if index >= self.size:
            zeros = array("q", bytes(8 * (index + 1 - self.size)))
            for name in self.FIELDS:
                getattr(self, name).extend(zeros)
            self.size = index + 1
        infer_ns = output_start - start
        if kind == 2:
            self.empty_count[index] += 1
            self.empty_ns[index] += infer_ns
            return
        self.infer_count[index] += 1
        self.infer_ns[index] += infer_ns
        self.output_count[index] += 1
        self.output_ns[index] += end - output_start
        if kind == 1:
            self.fail_count[index] += 1
            self.fail_ns[index] += end - start
        else:
            self.success_count[index] += 1
            self.success_ns[index] += end - start

    def as_json(self) -> dict[str, dict]:
        """{index: its statistics}, for each index a response was counted at."""
        out = {}
        for i in range(self.size):
            if not (self.infer_count[i] or self.empty_count[i]):
                continue
            out[str(i)] = {
                "compute_infer": {"count": self.infer_count[i], "ns": self.infer_ns[i]},
                "compute_output": {"count": self.output_count[i],
                                   "ns": self.output_ns[i]},
                "success": {"count": self.success_count[i], "ns": self.success_ns[i]},
                "fail": {"count": self.fail_count[i], "ns": self.fail_ns[i]},
                "empty_response": {"count": self.empty_count[i],
                                   "ns": self.empty_ns[i]},
                "cancel": {"count": 0, "ns": 0},
            }
        return out


class ModelStats:
    """One model version's statistics."""

    def __init__(self, name: str, version: int, histograms: bool = True):
        self.name = name
        self.version = version
        self.last_inference_ms = 0
        self.inference_count = 0
        self.execution_count = 0
        self.success_count = 0
        self.success_ns = 0
        self.queue_ns = 0
        self.compute_input_ns = 0
        self.compute_infer_ns = 0
        self.compute_output_ns = 0
        self.fail_count = 0
        self.fail_ns = 0
        self.failures: collections.Counter = collections.Counter()  # reason -> count
        self.cache_hit_count = self.cache_hit_ns = 0
        self.cache_miss_count = self.cache_miss_ns = 0
        self.cache_enabled = False  # set by the manager: shows the cache metrics
        self.batches: dict[int, BatchStat] = {}
        self.responses = ResponseTable()  # by response index
        self.histograms = histograms
        # Triton's name for the first one; request, queue and compute are shmserve's
        self.first_response_ms = Histogram()
        self.request_ms = Histogram()
        self.queue_ms = Histogram()
        self.compute_ms = Histogram()

    # -- updates ----------------------------------------------------------------------

    def batch_ran(self, requests, failed, sizes, total_size: int, start_ns: int,
                  input_end_ns: int, output_start_ns: int, end_ns: int) -> None:
        """A batch of `requests` (Queued) ran: `failed` holds the indices of requests
        that failed in the backend; `sizes` each request's batch size."""
        input_ns = input_end_ns - start_ns
        infer_ns = output_start_ns - input_end_ns
        output_ns = end_ns - output_start_ns
        self.execution_count += 1
        self.last_inference_ms = time.time_ns() // 1_000_000
        self._count_batch(total_size, input_ns, infer_ns, output_ns)
        histograms = self.histograms
        if histograms:
            self.compute_ms.observe((end_ns - start_ns) / 1e6)
            request_ms, first_ms, queue_ms = (self.request_ms, self.first_response_ms,
                                              self.queue_ms)
        n_ok = 0
        for i, q in enumerate(requests):
            req = q.req
            if failed and i in failed:
                self.fail_count += 1
                self.fail_ns += end_ns - req.start_ns
                self.failures[BACKEND] += 1
                continue
            n_ok += 1
            if req.cache_key:  # a cache miss, its insertion still to come
                self.cache_miss_count += 1
                self.cache_miss_ns += q.cache_lookup_ns
            self.inference_count += sizes[i]
            total = end_ns - req.start_ns
            queue = start_ns - q.queue_ns
            self.success_ns += total
            self.queue_ns += queue
            if histograms:
                request_ms.observe_request(first_ms, queue_ms, total / 1e6, queue / 1e6)
        self.success_count += n_ok
        self.compute_input_ns += input_ns * n_ok
        self.compute_infer_ns += infer_ns * n_ok
        self.compute_output_ns += output_ns * n_ok

    def _count_batch(self, size: int, input_ns: int, infer_ns: int,
                     output_ns: int) -> None:
        """One execution of batch size `size` in batch_stats, with its compute phases."""
        bs = self.batches.get(size)
        if bs is None:
            bs = self.batches[size] = BatchStat()
        bs.count += 1
        bs.input_ns += input_ns
        bs.infer_ns += infer_ns
        bs.output_ns += output_ns

    def ensemble_ran(self, q, batch_size: int, end_ns: int, input_ns: int, infer_ns: int,
                     output_ns: int) -> None:
        """An ensemble request succeeded. Triton counts it as one execution of its batch
        size, with no queue time of its own (its steps queue in their models) and the
        compute phases of all its steps summed (core EnsembleContext's stats)."""
        total = end_ns - (q.req.start_ns or q.queue_ns)
        self.success_count += 1
        self.success_ns += total
        if q.req.cache_key:  # a response cache miss, its insertion still to come
            self.cache_miss_count += 1
            self.cache_miss_ns += q.cache_lookup_ns
        self.inference_count += batch_size
        self.execution_count += 1
        self.last_inference_ms = time.time_ns() // 1_000_000
        self.compute_input_ns += input_ns
        self.compute_infer_ns += infer_ns
        self.compute_output_ns += output_ns
        self._count_batch(batch_size, input_ns, infer_ns, output_ns)
        if self.histograms:
            self.request_ms.observe(total / 1e6)
            self.first_response_ms.observe(total / 1e6)
            self.queue_ms.observe(0.0)
            self.compute_ms.observe((input_ns + infer_ns + output_ns) / 1e6)

    def cache_hit(self, q, lookup_start_ns: int, lookup_end_ns: int, end_ns: int) -> None:
        """A request (Queued) answered from the response cache. Its queue time runs
        from entering the scheduler (`q.queue_ns`) to the start of its lookup."""
        total = end_ns - (q.req.start_ns or q.queue_ns)
        queue = lookup_start_ns - q.queue_ns
        self.success_count += 1
        self.success_ns += total
        self.queue_ns += queue
        self.cache_hit_count += 1
        self.cache_hit_ns += lookup_end_ns - lookup_start_ns
        if self.histograms:
            self.request_ms.observe(total / 1e6)
            self.first_response_ms.observe(total / 1e6)
            self.queue_ms.observe(queue / 1e6)

    def cache_inserted(self, insert_ns: int) -> None:
        """A missed request's result went into the cache: the insertion is part of its
        miss time and of its request duration (it came after the request's end)."""
        self.cache_miss_ns += insert_ns
        self.success_ns += insert_ns

    def failed(self, q, reason: str, end_ns: int) -> None:
        """A request (Queued) that reached the scheduler failed outside a batch (timed
        out in the queue, cancelled, its instance lost)."""
        self.fail_count += 1
        self.fail_ns += end_ns - (q.req.start_ns or q.queue_ns or end_ns)
        self.failures[reason] += 1

    def responses_sent(self, entries) -> None:
        """A decoupled request's responses (ResponseStats entries), counted by their
        index as Triton does (ResponseTable.add)."""
        for entry in entries:
            if entry[0] < RESPONSE_STATS_INDICES:  # a worker's bound, kept here too
                self.responses.add(*entry)

    # -- reading ----------------------------------------------------------------------

    def as_json(self) -> dict:
        """The `model_stats` entry of Triton's statistics extension."""
        def duration(count, ns):
            return {"count": count, "ns": ns}

        compute_count = self.success_count - self.cache_hit_count
        return {
            "name": self.name,
            "version": str(self.version),
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": duration(self.success_count, self.success_ns),
                "fail": duration(self.fail_count, self.fail_ns),
                "queue": duration(self.success_count, self.queue_ns),
                "compute_input": duration(compute_count, self.compute_input_ns),
                "compute_infer": duration(compute_count, self.compute_infer_ns),
                "compute_output": duration(compute_count, self.compute_output_ns),
                "cache_hit": duration(self.cache_hit_count, self.cache_hit_ns),
                "cache_miss": duration(self.cache_miss_count, self.cache_miss_ns),
            },
            "response_stats": self.responses.as_json(),
            "batch_stats": [
                {"batch_size": size,
                 "compute_input": duration(b.count, b.input_ns),
                 "compute_infer": duration(b.count, b.infer_ns),
                 "compute_output": duration(b.count, b.output_ns)}
                for size, b in sorted(self.batches.items())],
            "memory_usage": [],
        }
