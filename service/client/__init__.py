"""The ``torchyard`` client commands: submit, jobs, show, metrics, logs, cancel, wait, summary.

They talk to a server over HTTP only and never import torch or the server's modules.
"""
