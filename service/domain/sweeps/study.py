"""A sweep's search in memory: Optuna's study, sampler and pruner, and which trials it knows.

The search and the early stopping are Optuna's (samplers: ``RandomSampler``, ``TPESampler``;
pruners: ``SuccessiveHalvingPruner`` for ASHA, ``MedianPruner``) through its ask-and-tell
interface, on an in-memory study rebuilt from torchyard's tables (``driver``). A grid is not
Optuna's ``GridSampler``, which builds every point of the grid (``itertools.product``) when it
is made: each grid trial's point is computed from its number (``service.domain.sweeps.grid``)
and enqueued as fixed parameters, so nothing of the study grows with the grid's size.
"""

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from service.domain.sweeps.spec import (
    AshaRule,
    ChoiceDim,
    IntDim,
    LogUniformDim,
    MedianRule,
    SweepSpec,
)


def optuna() -> Any:
    """Optuna, imported on first use (a server with no sweep never pays for it)."""
    import optuna as module

    module.logging.set_verbosity(module.logging.WARNING)
    return module


def distributions(spec: SweepSpec) -> dict[str, Any]:
    d = optuna().distributions
    out: dict[str, Any] = {}
    for name, dim in spec.space.items():
        if isinstance(dim, ChoiceDim):
            out[name] = d.CategoricalDistribution(dim.values)
        elif isinstance(dim, IntDim):
            out[name] = d.IntDistribution(dim.low, dim.high, step=dim.step, log=dim.log)
        else:
            out[name] = d.FloatDistribution(dim.low, dim.high, log=isinstance(dim, LogUniformDim))
    return out


def make_sampler(spec: SweepSpec, made: int) -> Any:
    """The sampler, seeded with ``seed + trials made`` so that a rebuilt one does not draw the
    first term's sequence again. A grid's trials all come with fixed parameters: its sampler
    never draws."""
    samplers = optuna().samplers
    seed = spec.seed + made
    if spec.method == "tpe":
        return samplers.TPESampler(seed=seed)
    return samplers.RandomSampler(seed=seed)


def make_pruner(spec: SweepSpec) -> Any:
    pruners = optuna().pruners
    rule = spec.prune
    if isinstance(rule, AshaRule):
        return pruners.SuccessiveHalvingPruner(
            min_resource=rule.min_epochs, reduction_factor=rule.reduction_factor,
            min_early_stopping_rate=0)
    if isinstance(rule, MedianRule):
        return pruners.MedianPruner(
            n_startup_trials=rule.startup_trials, n_warmup_steps=rule.warmup_epochs)
    return pruners.NopPruner()


def _fmt(value: float) -> str:
    return f"{value:.4g}"


@dataclass
class Study:
    """One sweep's search in this term. Trials are known by their number in the sweep."""

    spec: SweepSpec
    study: Any
    dists: dict[str, Any]
    trials: dict[int, Any] = field(default_factory=dict)  # number → live Optuna trial
    reported: dict[int, tuple[int, float]] = field(default_factory=dict)  # → last (epoch, value)
    told: set[int] = field(default_factory=set)  # numbers whose end the study was told
    holding: bool = False  # no trial is made while the disk floor refuses new jobs

    @classmethod
    def build(cls, spec: SweepSpec, made: int) -> "Study":
        study = optuna().create_study(
            direction="minimize" if spec.objective.mode == "min" else "maximize",
            sampler=make_sampler(spec, made), pruner=make_pruner(spec),
        )
        return cls(spec=spec, study=study, dists=distributions(spec))

    def ask(self, number: int, params: dict | None = None) -> Any:
        """A trial for trial ``number``: with ``params`` (a rebuild, a grid point) or drawn."""
        if params is not None:
            self.study.enqueue_trial(params)
        trial = self.study.ask(self.dists)
        self.trials[number] = trial
        return trial

    def report(self, number: int, epoch: int, value: float) -> bool:
        """Report an epoch's objective; True if the pruner says stop."""
        trial = self.trials[number]
        trial.report(value, epoch)
        self.reported[number] = (epoch, value)
        return self.spec.prune is not None and trial.should_prune()

    def last_epoch(self, number: int) -> int:
        return self.reported.get(number, (0, math.nan))[0]

    def tell(self, number: int, end: str | None, value: float | None = None) -> None:
        """How trial ``number`` ended: completed (with a finite value), pruned, or else failed."""
        states = optuna().trial.TrialState
        trial = self.trials.pop(number)
        if end == "completed" and value is not None and math.isfinite(value):
            self.study.tell(trial, value)
        elif end == "pruned":
            self.study.tell(trial, state=states.PRUNED)
        else:
            self.study.tell(trial, state=states.FAIL)
        self.told.add(number)

    def why_pruned(self, number: int, epoch: int, value: float) -> str:
        """The rule, the epoch and the comparison that pruned trial ``number``."""
        trial = self.trials[number]
        metric, mode = self.spec.objective.metric, self.spec.objective.mode
        worse = ">" if mode == "min" else "<"
        if not math.isfinite(value):
            return f"pruned at epoch {epoch}: {metric} is {value}"
        others = self.study.get_trials(deepcopy=False)
        rule = self.spec.prune
        if isinstance(rule, AshaRule):
            attrs = trial.storage.get_trial_system_attrs(trial._trial_id)
            rungs = [int(k.rsplit("_", 1)[1]) for k in attrs if k.startswith("completed_rung_")]
            rung = max(rungs, default=0)
            key = f"completed_rung_{rung}"
            values = sorted(t.system_attrs[key] for t in others if key in t.system_attrs
                            and t.number != trial.number) + [value]
            values.sort(reverse=mode == "max")
            cutoff = values[max(len(values) // rule.reduction_factor - 1, 0)]
            return (f"pruned by ASHA at epoch {epoch}: {metric} {_fmt(value)} {worse} rung "
                    f"{rung} cutoff {_fmt(cutoff)} (the best 1/{rule.reduction_factor} of "
                    f"{len(values)} trials go on)")
        at = [t.intermediate_values[epoch] for t in others if t.number != trial.number
              and t.state.is_finished() and epoch in t.intermediate_values]
        median = statistics.median(at) if at else float("nan")
        return (f"pruned by the median rule at epoch {epoch}: {metric} {_fmt(value)} {worse} "
                f"median {_fmt(median)} of {len(at)} trials at that epoch")
