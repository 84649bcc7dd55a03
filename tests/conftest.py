"""The suite's fixtures, registered from their modules in ``tests/fixtures/`` (one per kind).

| module | what it holds |
| --- | --- |
| ``suite`` | the ``--bench`` option, one byte-compile per run, xdist groups and order |
| ``processes`` | ``REPO_ROOT``, ``child_environ``, ``LOOPBACK_TLS``, ``gone``, ending processes |
| ``ports`` | ports reserved for live servers, handed to them as sockets; ``free_port`` |
| ``stores`` | ``store``, ``both_stores``, ``database_url``, ``postgres_server``, ``api``, ``sessions`` |
| ``servers`` | ``LiveServer``, ``live_server``, ``live_server_factory``, ``leader_and_standby`` |
| ``sharedservers`` | ``shared_server``, ``shared_script_server``, ``add_script`` |
| ``clusters`` | the Slurm test cluster: ``slurm``, ``slurm_server``, ``module_slurm_server`` |
| ``jobs`` | ``hooks``, ``every_record``, ``assert_each_record_once``, ``give_token``, ``cli`` |
| ``threadserver`` | ``serve_in_thread``: an app served in a thread of the test process |
| ``connections`` | ``await_requests_read``: a request known to be in a live server's hands |

Helpers stay importable from here (``from tests.conftest import LiveServer, hooks``). A fixture
several folders use goes in the module of its kind; one a folder uses, in that folder's
``conftest.py``.
"""

import pytest

# Before the imports below: the helpers' asserts get pytest's messages, as in a conftest.
pytest.register_assert_rewrite("tests.fixtures")

from tests.fixtures.clusters import (  # noqa: E402
    module_slurm_server,
    slurm_server_env,
    slurm_state,
)
from tests.fixtures.connections import await_requests_read  # noqa: E402
from tests.fixtures.jobs import (  # noqa: E402
    CLI_TIMEOUT_S,
    assert_each_record_once,
    assert_no_slot_held_twice,
    cli,
    every_record,
    give_token,
    hooks,
)
from tests.fixtures.ports import free_port, reserve_port  # noqa: E402
from tests.fixtures.processes import (  # noqa: E402
    ENV_AT_START,
    LOOPBACK_TLS,
    RANK_HOOKS,
    REPO_ROOT,
    child_environ,
    gone,
    kill_left_behind,
    stop_process,
)
from tests.fixtures.servers import (  # noqa: E402
    ADOPTS_ONLY,
    SHARED_WARM_DIRS,
    TERMINAL,
    WAIT_ROUND_S,
    LiveServer,
    _await_health,
    _await_warm_pool,
    _start_server,
    _stop_server,
    leader_and_standby,
)
from tests.fixtures.sharedservers import SHARED_API_TOKEN, _cancelled_after, add_script  # noqa: E402
from tests.fixtures.stores import STORES, both_stores, copy_sqlite  # noqa: E402
from tests.fixtures.suite import HEAVY_FIRST, XDIST_GROUPS  # noqa: E402

pytest_plugins = [
    "tests.fixtures.suite",
    "tests.fixtures.stores",
    "tests.fixtures.servers",
    "tests.fixtures.sharedservers",
    "tests.fixtures.clusters",
]

# The names these helpers had when they lived in this file.
_copy_sqlite = copy_sqlite
_stop_process = stop_process
_kill_left_behind = kill_left_behind

__all__ = [
    "ADOPTS_ONLY", "CLI_TIMEOUT_S", "ENV_AT_START", "HEAVY_FIRST", "LOOPBACK_TLS", "RANK_HOOKS",
    "REPO_ROOT", "SHARED_API_TOKEN", "SHARED_WARM_DIRS", "STORES", "TERMINAL", "WAIT_ROUND_S",
    "XDIST_GROUPS", "LiveServer", "_await_health", "_await_warm_pool", "_cancelled_after",
    "_copy_sqlite", "_kill_left_behind", "_start_server", "_stop_process", "_stop_server",
    "add_script", "assert_each_record_once", "await_requests_read", "assert_no_slot_held_twice", "both_stores",
    "child_environ", "cli", "copy_sqlite", "every_record", "free_port", "give_token", "gone",
    "hooks", "kill_left_behind", "leader_and_standby", "module_slurm_server", "reserve_port",
    "slurm_server_env", "slurm_state", "stop_process",
]
