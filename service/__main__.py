"""``python -m service``: the ``torchyard`` command (``service.cli``)."""

import gc

# No cyclic collections while the command line imports: its modules (typer, pydantic, the
# settings, the client) live as long as the process, so collector passes over them only cost
# CPU. ``serve`` turns the collector off again until its app has started (``service.cli``).
gc.disable()
from service.cli import main  # noqa: E402

gc.enable()

if __name__ == "__main__":  # not when a spawned API process imports it
    main()
