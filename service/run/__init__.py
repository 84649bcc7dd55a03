"""The run side: everything that runs next to a job's ranks rather than in the server.

The attempt loop (restarts, deadlines, heartbeats), starting torchrun or srun, the rank tee,
the run claim, process-tree handling and the warm server. Imports only ``torchyard_contract``
and itself, never torch (the warm server imports torch in its own process)."""
