"""Intake: what may be submitted, and what a stored spec becomes.

Decides: the checks every job spec passes before it is stored — the server's own bounds
(``admission``), script and data paths (``scriptpath``; the rule is ``torchyard_contract.confinement``), secrets
(``secretstore``), packages, disk, capacity — in one front door (``submission.Intake``) that
``POST /jobs`` and every sweep trial take.
May import: the contract, ``service.settings``, ``service.store``, ``domain.queue`` and
``domain.files``; never ``domain.loop``.
"""
