"""Tracking: every job's stored records exported to MLflow and to TensorBoard event files.

Decides: which jobs and sweeps are exported and where (``enrolment``, ``naming``), the points a
record makes (``points``: per-rank series and the cross-rank mean), the exactly-once delivery of
those points to an MLflow run (``runexport``, through ``mlflowclient``) and the job's event
files (``tbexport``, ``tensorboard``), run off the loop by the acting supervisor (``exporter``),
and what ``GET /jobs/{id}`` says of it (``view``). docs/tracking.md.
May import: the contract, ``service.settings``, ``service.store``, ``domain.lease``,
``domain.files`` and ``domain.records``; never ``domain.intake``, ``domain.sweeps`` (which
enrol their jobs here) or ``domain.loop`` (which starts the exporter).
"""
