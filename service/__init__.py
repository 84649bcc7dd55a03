"""torchyard service: REST API, storage and supervisor. Never imports torch."""

__version__ = "0.2.0"
