"""Job states and the only legal transitions between them. Terminal states are terminal.

``pausing`` and ``paused`` (docs/lifecycle.md): a running job asked to pause is ``pausing`` while
its ranks stop at a safe point (it still holds its resources), then ``paused`` (none held) until
it is resumed, when it is ``queued`` again. A queued job pauses at once.

A Slurm job whose failed attempt is to be retried elsewhere (``retry_elsewhere``) goes from
``starting`` or ``running`` back to ``queued``: its attempt loop ended the allocation (the
outcome ``requeue``) so that a new one can leave the failing node out (``--exclude``).
"""

from enum import Enum
from typing import Literal


class JobState(str, Enum):
    queued = "queued"
    starting = "starting"
    running = "running"
    pausing = "pausing"
    paused = "paused"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


TERMINAL_STATES = frozenset({JobState.succeeded, JobState.failed, JobState.cancelled})
# A group of the job may run and it holds resources.
ACTIVE_STATES = frozenset({JobState.starting, JobState.running, JobState.pausing})

# target state -> states it may be entered from
ALLOWED_FROM: dict[JobState, frozenset[JobState]] = {
    # Resumed (paused); restarted elsewhere (starting, running: a ``requeue`` outcome, Slurm's
    # ``--exclude`` needs a new allocation; starting when the attempt failed before a
    # supervisor tick saw rank 0 ready). Callers name the state they expect (``only_from``).
    JobState.queued: frozenset({JobState.paused, JobState.starting, JobState.running}),
    JobState.starting: frozenset({JobState.queued}),
    JobState.running: frozenset({JobState.starting}),
    JobState.pausing: frozenset({JobState.starting, JobState.running}),
    JobState.paused: frozenset({JobState.queued, JobState.pausing}),
    JobState.succeeded: ACTIVE_STATES,
    JobState.failed: frozenset({JobState.queued}) | ACTIVE_STATES,
    JobState.cancelled: frozenset({JobState.queued, JobState.paused}) | ACTIVE_STATES,
}


class SweepState(str, Enum):
    """A sweep's state (``sweeps.state``): running until it ends; the ends are terminal."""

    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


class TrialOutcome(str, Enum):
    """How a sweep's trial ended (``sweep_trials.outcome``; ``pruned``: its early-stopping rule
    stopped it, so its job is ``cancelled``)."""

    completed = "completed"
    pruned = "pruned"
    failed = "failed"
    cancelled = "cancelled"


class WebhookEvent(str, Enum):
    """What a webhook delivery tells of (``webhook_deliveries.event``): a job's state change,
    ``restarted`` (a new attempt after a failure) or ``paused``."""

    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"
    restarted = "restarted"
    paused = "paused"


class DeliveryState(str, Enum):
    """A webhook delivery's state (``webhook_deliveries.state``)."""

    pending = "pending"
    delivered = "delivered"
    failed = "failed"


# The API's schemas spell these as Literals (an inline ``enum`` in the published document, as it
# always was); tests/project/test_vocabularies.py checks each equals its Enum above.
SweepStateName = Literal["running", "succeeded", "failed", "cancelled"]
TrialOutcomeName = Literal["completed", "pruned", "failed", "cancelled"]
WebhookEventName = Literal["running", "succeeded", "failed", "cancelled", "restarted", "paused"]
DeliveryStateName = Literal["pending", "delivered", "failed"]
