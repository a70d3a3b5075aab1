"""Triton's scheduler test hooks (TRITONSERVER_DELAY_SCHEDULER and
TRITONSERVER_BACKLOG_DELAY_SCHEDULER) as pure state, and the dynamic batcher under
them. Each test names the rule of Triton's core it checks."""

from tritonclient.grpc import model_config_pb2

from scheduler.scheduling.delay_hooks import SchedulerHold
from scheduler.scheduling.dynamic_scheduler import make_batcher


def test_values_are_read_as_atoi_reads_them():
    # Triton: delay_cnt = atoi(getenv(...)): leading digits count, the rest is 0
    env = {"TRITONSERVER_DELAY_SCHEDULER": " 12abc",
           "TRITONSERVER_BACKLOG_DELAY_SCHEDULER": "x3"}
    hold = SchedulerHold.from_env(env)
    assert (hold.queued, hold.backlog) == (12, 0)
    assert SchedulerHold.from_env({}).active is False
    # a negative count would be a size_t that never comes: no hold rather than a hang
    assert SchedulerHold.from_env({"TRITONSERVER_DELAY_SCHEDULER": "-4"}).active is False


def test_delay_hold_ends_once_n_requests_are_queued_and_for_good():
    # DynamicBatchScheduler::BatcherThread: wait until queue_.Size() >= delay_cnt, then
    # delay_cnt = 0 for the rest of the run
    hold = SchedulerHold(3)
    assert hold.holding(0) and hold.holding(2)
    assert not hold.holding(3)
    assert not hold.holding(0)  # over: the queue may shrink below N again


def test_backlog_hold_waits_for_both_counts():
    # SequenceBatchScheduler::DelayScheduler: hold while the slot queues together hold
    # fewer than TRITONSERVER_DELAY_SCHEDULER, or (when set) while the backlog holds
    # fewer than TRITONSERVER_BACKLOG_DELAY_SCHEDULER requests
    hold = SchedulerHold(4, backlog=2)
    assert hold.holding(3, backlog=5)  # slots short
    assert hold.holding(4, backlog=1)  # backlog short
    assert not hold.holding(4, backlog=2)
    assert not hold.holding(0, backlog=0)  # and it stays released


def test_backlog_hold_does_nothing_without_the_delay_hold():
    # Triton calls DelayScheduler only while delay_cnt > 0: the backlog count alone
    # never holds anything (L0_sequence_batcher sets BACKLOG=0 beside DELAY=12)
    hold = SchedulerHold.from_env({"TRITONSERVER_BACKLOG_DELAY_SCHEDULER": "5"})
    assert not hold.active
    assert not hold.holding(0, backlog=0)


def _config():
    cfg = model_config_pb2.ModelConfig(name="m", max_batch_size=8)
    cfg.dynamic_batching.priority_levels = 2
    cfg.dynamic_batching.default_priority_level = 2
    return cfg


def test_dynamic_batcher_counts_every_priority_level_and_ignores_the_backlog_hook():
    # the dynamic batcher's queue_.Size() spans all priority levels; it never reads
    # TRITONSERVER_BACKLOG_DELAY_SCHEDULER
    b = make_batcher(_config(), {"TRITONSERVER_DELAY_SCHEDULER": "3",
                                 "TRITONSERVER_BACKLOG_DELAY_SCHEDULER": "100"})
    b.enqueue("low", batch_size=1, shape_key=None, now=0, priority=2)
    b.enqueue("high", batch_size=1, shape_key=None, now=0, priority=1)
    assert b.next_batch(0) is None
    assert b.next_deadline() is None  # nothing changes by itself while held
    b.enqueue("low2", batch_size=1, shape_key=None, now=0, priority=2)
    assert b.next_batch(0) == ["high", "low", "low2"]
    b.enqueue("later", batch_size=1, shape_key=None, now=0)
    assert b.next_batch(0) == ["later"]
