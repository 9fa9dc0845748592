"""Ray for a lab's check, and the line that says why a Ray run failed."""
import os

from labs.harness import ROOT
from labs.ranks import COLLECTIVE_TIMEOUT_S


def start_ray(address: str, watched: dict | None = None, cpus: int = 2, **environment: str) -> None:
    """Ray for a lab's check: started on this machine with these CPUs (2: 2 workers), or the cluster at address. Its
    controller polls the workers every 0.2 s (each report waits for a poll), a report that a rank never joins fails
    after COLLECTIVE_TIMEOUT_S, and every process of the job imports labs/ from this repository (then what this
    process's PYTHONPATH holds) and runs labs.watch.setup_worker first (watched: labs.watch.environment's
    variables). The environment is set first: Ray Train hands it on to its controller and workers."""
    import ray

    from common.ray_setup import init_options, worker_setup

    os.environ.update(RAY_USAGE_STATS_ENABLED="0", RAY_TRAIN_COLLECTIVE_TIMEOUT_S=str(COLLECTIVE_TIMEOUT_S),
                      **environment)
    started_here = dict(num_cpus=cpus, include_dashboard=False) if address == "local" else {}
    python_path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    job = worker_setup()
    env_vars = {**job["env_vars"], "PYTHONPATH": python_path, **(watched or {})}
    ray.init(address=address, **started_here, **init_options(address),
             runtime_env={**job, "env_vars": env_vars, "worker_process_setup_hook": "labs.watch.setup_worker"})


def ray_error(error: Exception) -> str:
    """The line of a failed Ray run that says why: the ranks that never joined a report; else the lowest rank's own
    exception, its first line (Ray keeps each worker's, WorkerGroupError.worker_failures: its message shortens their
    tracebacks, some to before their exception's line); else the message's last line."""
    lines = str(error).strip().splitlines() or [type(error).__name__]
    hung = next((line for line in lines if "have not joined" in line), None)
    failures = getattr(error, "worker_failures", None)
    if hung or not failures:
        return hung or lines[-1]
    failure = failures[min(failures)]
    return f"{type(failure).__name__}: {(str(failure).strip().splitlines() or [''])[0]}"
