"""Names of the environment variables the job's launcher sets and a rank reads.

Set by the server for the job's attempt loop (and by the attempt loop per attempt); read by ``worker.env``. The
job token travels only here, never on a command line or on disk. torchrun adds its own
(``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``).
"""

API_URL = "TORCHYARD_API_URL"  # where ranks POST records
JOB_ID = "TORCHYARD_JOB_ID"
# The job's attempt loop (its pid): a warm rank, which is not the attempt loop's descendant, lets it and the
# stack sampler it starts ptrace it (Yama's PR_SET_PTRACER; service.run.warm.child).
STACKS_TRACER = "TORCHYARD_STACKS_TRACER"
JOB_TOKEN = "TORCHYARD_JOB_TOKEN"  # bearer token for this job's record endpoint
RUN_DIR = "TORCHYARD_RUN_DIR"  # see torchyard_contract.rundir
ATTEMPT = "TORCHYARD_ATTEMPT"  # 1-based; set by the attempt loop for each attempt
OUTPUT_DIR = "TORCHYARD_OUTPUT_DIR"  # the job's outputs (one per job, shared by its ranks)
RESUME_DIR = "TORCHYARD_RESUME_DIR"  # checkpoints of the job named by the spec's resume_from
DEVICE = "TORCHYARD_DEVICE"  # cpu | cuda, as placed by the supervisor
BACKEND = "TORCHYARD_BACKEND"  # gloo | nccl
PARAMS = "TORCHYARD_PARAMS"  # a sweep's trial: its parameters as a JSON object (worker.params)
# torch's own: where @record writes the first failing rank's exception.
ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
