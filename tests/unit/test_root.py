"""The root process's restart rules (scheduler/processes/root.py), with an injected clock."""

from scheduler.processes.root import (BACKOFF_S, MAX_RESTARTS, RESTART_WINDOW_S, RestartBudget,
                            backoff, should_restart)


def test_only_a_killed_scheduler_is_restarted():
    """A death by a signal nobody asked for restarts; an exit status is the scheduler's
    own decision (0 stopped, 1 could not start), and a stop in progress is honoured."""
    assert should_restart(-9, stopping=False)
    assert should_restart(-11, stopping=False)
    assert not should_restart(-9, stopping=True)
    assert not should_restart(0, stopping=False)
    assert not should_restart(1, stopping=False)


def test_restart_budget_limits_restarts_in_a_window():
    """At most MAX_RESTARTS in RESTART_WINDOW_S; the window slides, so a server that
    was killed long ago may be restarted again."""
    now = [0.0]
    budget = RestartBudget(clock=lambda: now[0])
    for _ in range(MAX_RESTARTS):
        assert budget.take()
        now[0] += 1.0
    assert not budget.take()
    now[0] += RESTART_WINDOW_S
    assert budget.recent() == 0
    assert budget.take()


def test_backoff_grows_with_recent_restarts_and_is_capped():
    """The first restart is immediate; later ones in the window wait longer, capped."""
    assert backoff(0) == 0.0
    pauses = [backoff(n) for n in range(10)]
    assert pauses == sorted(pauses)
    assert max(pauses) == BACKOFF_S[-1]
