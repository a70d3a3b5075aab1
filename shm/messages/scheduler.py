"""The scheduler's inbox: everything frontends and workers send it."""

from shm.messages.frontend import TO_SCHEDULER_FROM_FRONTEND
from shm.messages.results import InferResponse, ReleaseBlocks
from shm.messages.worker import TO_SCHEDULER_FROM_WORKER

# InferResponse: the scheduler is itself a requester (ensemble steps, BLS, warmup).
# ReleaseBlocks: a client is done with an ensemble's outputs, which the scheduler
# handed on from the workers that own them.
SCHEDULER_INBOX = tuple(dict.fromkeys(
    TO_SCHEDULER_FROM_FRONTEND + TO_SCHEDULER_FROM_WORKER + (InferResponse, ReleaseBlocks)))
