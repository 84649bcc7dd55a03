"""The queue: policy (``scheduler``), what the host has (``inventory``), positions every process answers (``snapshot``)."""
