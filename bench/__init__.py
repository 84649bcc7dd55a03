"""torchyard benchmarks: ``python -m bench all`` runs every benchmark and prints the results table.

Each benchmark is a module with ``run(smoke: bool) -> list[Row]``; ``--smoke`` runs it at tiny
sizes (CI keeps the scripts working; the figures are not timed tests). See docs/benchmarks.md.
"""
