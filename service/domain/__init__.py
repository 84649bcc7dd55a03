"""The domain: every decision about jobs, sweeps, records and files, in one folder per question.

``intake`` (what may be submitted), ``queue`` (who starts where, and why the rest wait),
``loop`` (the acting supervisor's tick and its steps), ``lease`` (one supervisor at a time:
every acting part fences its writes with it), ``records`` (what happens to a reported
record), ``files`` (packages in, artifacts out, clean-up, disk), ``sweeps``, ``webhooks``.
No HTTP request objects, no subprocess, no SQL text: SQL lives in ``service.store``, processes
behind the executor Protocol (``service.executor.base``); settings come from ``service.settings``.
"""
