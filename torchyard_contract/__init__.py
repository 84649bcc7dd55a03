"""The contract between the server, a job's attempt loop and its ranks, spelled once.

Both sides import this package; it imports neither FastAPI, SQLAlchemy nor torch (a test checks):

* :mod:`torchyard_contract.spec` — the job spec model, validated by the API and by each rank;
* :mod:`torchyard_contract.records` — the record wire format and its one non-finite codec;
* :mod:`torchyard_contract.rundir` — the run-directory layout;
* :mod:`torchyard_contract.envnames` — the environment variables a rank reads.
"""
