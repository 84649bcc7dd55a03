"""Forwarding package, kept for one release: warm ranks' run side is now ``service.run.warm``.

Only ``relay.py`` is kept: a shim running since before the upgrade still names this path as
each rank's program. Remove in the release after.
"""
