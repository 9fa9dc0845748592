"""What every process of a Ray step's job runs first (ray.init's runtime_env, common.ray_setup.WORKER_SETUP). No
torch here: Ray sets a worker's OMP_NUM_THREADS (its CPUs) only after this runs, and torch reads it once, on import."""
import logging
import os

import ray


def setup_worker() -> None:
    """Runs first in every process of a Ray step's job: its Ray Train workers, controller and helpers."""
    quiet_report_logs()
    # Ray's state queries without an address (Train's placement-group cleaner asks them every few seconds whether
    # the controller lives) reach the cluster named by RAY_ADDRESS, else the Ray started last on this machine,
    # which may be another one: when that one stops, the query times out and its thread dies with a traceback.
    os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address


def quiet_report_logs() -> None:
    """Ray Train logs every ray.train.report at INFO, from every rank, through a logger named after its source file
    (not "ray.train"), which its LoggingConfig does not reach; in local mode, no worker applies that LoggingConfig
    at all."""
    from ray.train.v2._internal.execution import context

    logging.getLogger(context.__file__).setLevel(logging.WARNING)
    logging.getLogger("ray.train").setLevel(logging.WARNING)
