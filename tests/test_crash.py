"""The pieces that make a worker's death mid-epoch (kill -9, the way a real crash comes) a few lines on the console:
the progress bar of the dead worker's epoch is taken over by the restarted group's, a surviving worker's traceback is
one line on the console, the controller's shutdown noise is gone. What the room then sees, end to end, is checked on
the tracked variant's run, whose worker test_tracking kills in epoch 2 (one crash for both)."""
import logging
from types import SimpleNamespace

import ray.train
from ray._private.log import PlainRayHandler
from ray.experimental import tqdm_ray

from common import ray_setup, worker_setup


def test_the_bar_of_a_restarted_epoch_is_the_dead_workers_bar(monkeypatch):
    """Two attempts at epoch 3 of one run, in two processes: one bar on the driver, drawn as the driver's own."""
    states = []
    monkeypatch.setattr(tqdm_ray, "instance", lambda: SimpleNamespace(process_state_update=states.append))
    monkeypatch.setenv(ray_setup.DRIVER, "10.0.0.1 4242")
    monkeypatch.setattr(ray.train, "get_context", lambda: SimpleNamespace(get_experiment_name=lambda: "ray_ddp-1"))
    for pid in (111, 222):
        monkeypatch.setattr(tqdm_ray.os, "getpid", lambda pid=pid: pid)
        assert list(ray_setup.progress_bar(range(3), 3, "epoch 3", show=True)) == [0, 1, 2]
    assert {(s["ip"], s["pid"], s["uuid"]) for s in states} == {("10.0.0.1", 4242, "ray_ddp-1 epoch 3")}
    assert states[-1]["closed"]


def test_a_failed_training_function_is_one_line_on_the_console_and_whole_in_the_log(monkeypatch):
    """The worker's handlers as Ray Train configures them: its log file first, the console last."""
    whole, console = [], []
    file_handler, console_handler = logging.Handler(), PlainRayHandler()
    file_handler.emit = lambda record: whole.append(record.getMessage())
    console_handler.emit = lambda record: console.append(record.getMessage())
    monkeypatch.setattr(logging.getLogger("ray.train"), "handlers", [file_handler, console_handler])
    monkeypatch.setattr(logging.getLogger("ray.train"), "propagate", False)
    util = logging.getLogger(worker_setup.TRAINING_ERROR_LOGGER)
    monkeypatch.setattr(util, "filters", [worker_setup.one_line_on_the_console])
    error = "Error in training function:\nTraceback (most recent call last):\n  File ...\nRuntimeError: peer reset"
    util.error(error)
    assert whole == [error]
    assert console == ["Error in training function: RuntimeError: peer reset (all of it: Ray Train's worker log, "
                       "under Ray's logs folder)"]
