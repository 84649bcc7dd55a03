"""Records: what happens to a record a rank reported, and how records are read back.

Decides: which records are accepted (``ingest``: validation, idempotence, the loss guard of
``lossguard``), which ranks and attempts a job may have (``scope``), a finished attempt's spool
(``spool``), and the read-side shapes routes serve (``summary``, ``downsample``).
May import: the contract, ``service.settings`` and ``service.store``.
"""
