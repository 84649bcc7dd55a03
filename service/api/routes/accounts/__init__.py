"""Routes of who is who and who used what: teams, users and their tokens (`/me` too), the audit
log, and the slot usage account. They read and change accounts through
``service.domain.identity`` and ``service.domain.queue.standing``; who may call each is in
``service.api.authz`` like every other route."""
