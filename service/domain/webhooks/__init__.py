"""Webhooks: telling operators' endpoints what happened to a job.

Decides: which state changes become deliveries and how each is sent, signed, retried and
shared out between endpoints (``delivery``), and one try on the wire under one deadline
(``sender``). The endpoints file itself is parsed by ``service.settings.webhookfile``.
May import: the contract, ``service.settings``, ``service.store`` and ``domain.lease``.
"""
