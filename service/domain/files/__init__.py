"""Files: code in, results out, and what is left on disk.

Decides: packages stored by digest and unpacked within their bounds (``packages``, ``unpack``,
``treewriter``), a job's outputs listed and served (``artifacts``, ``artifactlisting``,
``artifactnames``), a running job asked for its stacks through its run directory
(``stackrequest``), what clean-up removes (``cleanup``; trees of any depth: ``torchyard_contract.treeremoval``)
and the disk floor (``diskspace``). Everything read here was written by a job: untrusted,
bounded.
May import: the contract, ``service.settings`` and ``service.store``.
"""
