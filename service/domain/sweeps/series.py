"""A sweep for its dashboard page in one read: every trial's row (parameters, state, outcome,
value, the epoch a pruned one stopped at) and its objective per epoch as a chart line,
downsampled as job series are (``service.domain.records.downsample``), so a sweep of 200 long
trials draws at once.

The objective per epoch is the one the sweep judges (``manage.view``: reduced across ranks,
complete epochs only, cut at the pruning epoch); this module only shapes it for a chart.
"""

from dataclasses import dataclass

from sqlalchemy.orm import Session

from service.domain.sweeps.manage import SweepView, TrialView, view
from service.store import sweeps as store
from service.store.tables import Sweep


@dataclass(frozen=True)
class TrialLine:
    trial: TrialView
    pruned_epoch: int | None  # the epoch a pruned trial was stopped at; else None
    x: list[int]  # epochs, ascending, downsampled
    y: list[float]
    points: int  # epochs before downsampling


def downsampled(epochs: dict[int, float], max_points: int) -> tuple[list[int], list[float]]:
    """``epochs`` (epoch → value) as x and y, at most ``max_points`` of them (M4: the first,
    last and extreme points kept)."""
    # Imported on the first chart read, as the job series route does: numpy and tsdownsample
    # are start-up time most server processes never use.
    from service.domain.records.downsample import downsample_indices

    x = list(epochs)
    y = list(epochs.values())
    keep = downsample_indices(y, max_points)
    return [x[i] for i in keep], [y[i] for i in keep]


def sweep_lines(session: Session, sweep: Sweep, max_points: int) -> tuple[SweepView, list[TrialLine]]:
    """The sweep as ``manage.view`` reads it, and one line per trial (oldest trial first), each
    at most ``max_points`` points."""
    v = view(session, sweep)
    pruned = {job.id: job.pruned_epoch for job in store.trials(session, sweep.id)}
    lines = []
    for t in v.trials:
        x, y = downsampled(t.epochs, max_points)
        lines.append(TrialLine(trial=t, pruned_epoch=pruned.get(t.job_id), x=x, y=y,
                               points=len(t.epochs)))
    return v, lines
