"""The leases this worker's instances are under (shm/messages/leases.py).

A lease lends an instance to one frontend: while it lasts, that frontend sends its
requests for the instance's model here straight (one at a time, or up to the lease's
depth, those not run yet waiting in this worker's inbox as the instance's queue), and
the scheduler, which neither hears of them nor schedules the instance, is not woken
for them. At c=1 that is one process's wake-up less per request
(scheduler/scheduling/dynamic_scheduler.py says when the scheduler lends one and when
it takes it back).

The worker is where a lease is checked, because it is where requests and the end of a
lease meet in order: the scheduler grants one with the batch that starts it, and takes
it back with EndLease. A request sent under a lease that has ended (its frontend had
not heard yet) is handed on to the scheduler as the request it is, so nothing is lost
in the race. Only the receiving thread reads and writes this table.
"""

from __future__ import annotations


class Leases:
    def __init__(self) -> None:
        self._held: dict[str, tuple[str, int]] = {}  # instance -> (frontend, lease id)

    def grant(self, instance: str, frontend: str, lease: int) -> None:
        self._held[instance] = (frontend, lease)

    def holds(self, instance: str, frontend: str, lease: int) -> bool:
        return self._held.get(instance) == (frontend, lease)

    def end(self, instance: str, lease: int = 0) -> tuple[str, int] | None:
        """End the lease on `instance` (only lease `lease`, if given): (its frontend,
        its id), or None if no such lease was held."""
        held = self._held.get(instance)
        if held is None or (lease and held[1] != lease):
            return None
        del self._held[instance]
        return held

    def of(self, frontend: str) -> list[tuple[str, int]]:
        """The (instance, lease id) pairs `frontend` holds."""
        return [(inst, lease) for inst, (fe, lease) in self._held.items() if fe == frontend]
