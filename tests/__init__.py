"""The suite (tests/README.md).

Importing this package (pytest does, before ``tests/conftest.py``) turns the cyclic collector
off until the tests are collected (``pytest_collection_finish`` there freezes what was built and
turns it back on): what is imported and collected lives for the whole session, and collector
passes over it were ~2 of the ~10 CPU s a worker spends collecting.
"""

import gc

gc.disable()
