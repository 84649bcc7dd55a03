"""Sweeps: a search over job specs, its trials, and their objective.

Decides: what a sweep request is and each trial's spec (``spec``), a grid's size and points
(``grid``), what a trial scored (``outcome``), the search in memory (``study``), sweeps as the
routes see them and their record of deleted trials (``manage``: create, cancel, read, settle),
and the driver the acting supervisor steps (``driver``: make trials, prune them, end the sweep).
May import: the contract, ``service.settings``, ``service.store``, ``domain.lease``,
``domain.intake``, ``domain.queue`` (a team's quota) and ``domain.records``; never ``domain.loop``, which steps the driver
(``driver.SweepLoop`` says what it uses of it).
"""
