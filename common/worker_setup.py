"""What every process of a Ray step's job runs first (ray.init's runtime_env, common.ray_setup.worker_setup()). No
torch here: Ray sets a worker's OMP_NUM_THREADS (its CPUs) only after the setup hook runs, and torch reads it once,
on import."""
import logging
import os

import ray

from .ray_internals import (CONTROLLER_NOISE, REPORT_LOGGER, TRAINING_ERROR, TRAINING_ERROR_LOGGER,
                            console_handler_class, worker_log_path)


def setup_worker() -> None:
    """Runs first in every process of a Ray step's job: its Ray Train workers, controller and helpers."""
    quiet_report_logs()
    for name in CONTROLLER_NOISE:  # what a crashed worker makes the controller print, tracebacks included
        logging.getLogger(name).addFilter(lambda record: record.levelno >= logging.ERROR)
    logging.getLogger(TRAINING_ERROR_LOGGER).addFilter(one_line_on_the_console)
    # Ray's state queries without an address (Train's placement-group cleaner asks them every few seconds whether
    # the controller lives) reach the cluster named by RAY_ADDRESS, else the Ray started last on this machine,
    # which may be another one: when that one stops, the query times out and its thread dies with a traceback.
    os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address


def quiet_report_logs() -> None:
    """Ray Train logs every ray.train.report at INFO, from every rank (ray_internals.REPORT_LOGGER); in local mode,
    no worker applies the run's LoggingConfig at all."""
    logging.getLogger(REPORT_LOGGER).setLevel(logging.WARNING)
    logging.getLogger("ray.train").setLevel(logging.WARNING)


def one_line_on_the_console(record: logging.LogRecord) -> bool:
    """A filter of the logger through which Ray Train logs a worker's failed training function. When a worker dies,
    the others fail in their next collective, each with a traceback: Ray Train's log file of the worker gets it
    whole, the console its last line and where the whole is."""
    message = record.getMessage()
    if not message.startswith(TRAINING_ERROR):
        return True
    whole = worker_log_path() or "Ray Train's worker log, under Ray's logs folder"
    line = f"{TRAINING_ERROR} {message.strip().splitlines()[-1]} (all of it: {whole})"
    short = logging.makeLogRecord(dict(record.__dict__, msg=line, args=()))
    for handler in logging.getLogger("ray.train").handlers:  # where the record would have gone
        handler.handle(short if isinstance(handler, console_handler_class()) else record)
    return False  # handled
