"""Sweeps: a search over job specs, its trials, and their objective.

Decides: what a sweep request is and each trial's spec (``spec``), sweeps as the routes see
them (``manage``: create, cancel, read), and the driver the acting supervisor steps
(``driver``: make trials, prune them, end the sweep).
May import: the contract, ``service.settings``, ``service.store``, ``domain.lease``,
``domain.intake`` and ``domain.records``; never ``domain.loop``, which steps the driver
(``driver.SweepLoop`` says what it uses of it).
"""
