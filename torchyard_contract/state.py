"""Job states and the only legal transitions between them. Terminal states are terminal."""

from enum import Enum


class JobState(str, Enum):
    queued = "queued"
    starting = "starting"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


TERMINAL_STATES = frozenset({JobState.succeeded, JobState.failed, JobState.cancelled})
ACTIVE_STATES = frozenset({JobState.starting, JobState.running})

# target state -> states it may be entered from
ALLOWED_FROM: dict[JobState, frozenset[JobState]] = {
    JobState.starting: frozenset({JobState.queued}),
    JobState.running: frozenset({JobState.starting}),
    JobState.succeeded: ACTIVE_STATES,
    JobState.failed: frozenset({JobState.queued}) | ACTIVE_STATES,
    JobState.cancelled: frozenset({JobState.queued}) | ACTIVE_STATES,
}
