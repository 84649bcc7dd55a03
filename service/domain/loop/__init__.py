"""The loop: the acting supervisor's tick and its steps.

Decides: the one owner of allocations and state changes after submit (``supervisor``) and the
steps of its tick — adopting after a restart (``recovery``), the
scheduling pass (``scheduling``, ``submits``), starting a job (``launch``), reaping ended
processes (``reaping``) and ending jobs off the loop (``finisher``), cancels and guard stops
(``stops``), pauses (``pauses``); ``context`` is what the steps share.
May import: every other domain folder, ``service.store``, ``service.settings`` and the executor
Protocol (``service.executor.base``) only.
"""
