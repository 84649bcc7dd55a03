"""Files: code in, results out, and what is left on disk.

Decides: packages stored by digest and unpacked within their bounds (``packages``, ``unpack``,
``treewriter``), trees of any depth removed (``treeremoval``), a job's outputs
listed and served (``artifacts``), a running job asked for its stacks through its run
directory (``stackrequest``), what clean-up removes (``cleanup``) and the disk floor
(``diskspace``). Everything read here was written by a job: untrusted, bounded.
May import: the contract, ``service.settings`` and ``service.store``.
"""
