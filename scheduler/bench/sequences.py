"""How the bench drives a sequence model (perf_analyzer's rules, docs/cli.md): each
concurrent stream runs one sequence after another, the first request of each with
sequence_start and the last with sequence_end; a sequence's length is
--sequence-length within +/- --sequence-length-variation percent; correlation ids
come from --sequence-id-range. A client module, never imported by the server.

Ids never collide between streams: of S streams, stream g uses only the ids
start + g + j*S (j = 0, 1, ...), cycling within the range's end when it has one, so two
live sequences never share an id (a shared id would restart the other's state).
"""

from __future__ import annotations

import random


class SequenceDriver:
    """The sequence flags and correlation id of one stream's requests."""

    def __init__(self, plan: dict, index: int, total: int, seed: int = 0,
                 lengths: list | None = None):
        # lengths: the steps of each data stream of a JSON --input-data file; each new
        # sequence takes the next stream round-robin, and its length when the plan has
        # none (perf_analyzer: --sequence-length unset and input data given)
        self.lengths = lengths or None
        if plan["length"] is None and not self.lengths:
            raise ValueError("a sequence length, or input data streams to take it from")
        self.length = None if plan["length"] is None else int(plan["length"])
        self.variation = float(plan.get("variation", 0.0))
        self.start = int(plan.get("id_start", 1))
        end = plan.get("id_end")
        self.index, self.total = index, total
        # how many ids this stream owns in a bounded range (None: unbounded)
        self.count = None if end is None else len(range(index, end - self.start, total))
        if self.count == 0:
            raise ValueError(f"--sequence-id-range {self.start}:{end} has no id for "
                             f"stream {index} of {total}")
        self.rng = random.Random(seed)
        self.begun = 0  # sequences started
        self.left = 0  # requests left in the current sequence
        self.id = 0
        self.data_index = 0  # the data stream of the current sequence
        self.step = -1  # the current request's place in its sequence

    def _length(self) -> int:
        if self.length is None:
            return self.lengths[self.data_index]
        if not self.variation:
            return self.length
        d = self.length * self.variation / 100.0
        return max(1, round(self.rng.uniform(self.length - d, self.length + d)))

    def _next_id(self) -> int:
        j = self.begun if self.count is None else self.begun % self.count
        return self.start + self.index + j * self.total

    def next(self) -> dict:
        """The next request's sequence_id, sequence_start and sequence_end."""
        first = self.left == 0
        if first:
            self.id = self._next_id()
            if self.lengths:
                self.data_index = (self.index + self.begun) % len(self.lengths)
            self.begun += 1
            self.left = self._length()
            self.step = -1
        self.step += 1
        self.left -= 1
        return {"sequence_id": self.id, "sequence_start": first,
                "sequence_end": self.left == 0}

    @property
    def open(self) -> bool:
        """A sequence has begun and not yet ended."""
        return self.left > 0

    def close(self) -> dict | None:
        """Flags of one request that ends the open sequence (unmeasured, when the stream
        stops mid-sequence: its slot on the server is freed at once rather than after
        the idle timeout, and the next point may reuse its id); None if none is open."""
        if not self.open:
            return None
        self.left = 0
        return {"sequence_id": self.id, "sequence_start": False, "sequence_end": True}

    def failed(self) -> None:
        """The last request failed: the next one starts a new sequence on a new id (the
        server may have refused the start, or dropped the sequence)."""
        self.left = 0
