"""Webhooks: telling operators' endpoints what happened to a job.

Decides: which state changes become deliveries and how each is sent, signed and retried
(``delivery``). The endpoints file itself is parsed by ``service.settings.webhookfile``.
May import: the contract, ``service.settings``, ``service.store`` and ``domain.lease``.
"""
