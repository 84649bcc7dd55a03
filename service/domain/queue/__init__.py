"""The queue: who starts where, and why the others wait.

Decides: the policy (``scheduler``, pure), which running jobs a more urgent one pauses
(``preemption``), where a job fits on this host (``placement``: the one capacity check), what
the host has (``inventory``) and the positions every process answers (``snapshot``); for teams,
what holds their jobs (``quota``), which borrowed jobs go back (``reclaim``), their recent usage
(``fairshare``), a budget's period (``budget``) and where each stands (``standing``).
May import: the contract, ``service.settings`` and ``service.store``; no other domain folder.
"""
