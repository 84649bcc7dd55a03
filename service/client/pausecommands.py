"""``torchyard pause JOB`` and ``torchyard resume JOB`` (docs/lifecycle.md, "Pause and resume")."""

from service.client.options import DEFAULT_URL, JobArg, TokenOpt, UrlOpt, connect, print_job_line


def pause(job_id: JobArg, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Pause a job; it frees its GPUs or slots once its ranks have checkpointed.

    A queued job is paused at once; a running one is pausing until its ranks stop. Exit 5 when
    the job has ended already."""
    with connect(url, token) as client:
        print_job_line(client.pause(job_id))


def resume(job_id: JobArg, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Queue a paused job again; it goes on from its last checkpoint as a new attempt."""
    with connect(url, token) as client:
        print_job_line(client.resume(job_id))
