"""The domain: submission rules, the supervisor's tick, launch, the queue, finishing jobs, the lease.

No HTTP request objects, no subprocess, no SQL text: SQL lives in ``service.store``, processes
behind ``service.executor``."""
