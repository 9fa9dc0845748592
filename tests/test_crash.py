"""What the room sees when a worker dies mid-epoch, the way a real crash comes (kill -9), and the pieces that make
it a few lines: the progress bar of the dead worker's epoch is taken over by the restarted group's, a surviving
worker's traceback is one line on the console, the controller's shutdown noise is gone."""
import json
import logging
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import ray.train
from ray._private.log import PlainRayHandler
from ray.experimental import tqdm_ray

from common import ray_setup, worker_setup
from conftest import RAY_DDP, ROOT, SMOKE, start


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


@pytest.mark.timeout(300)
def test_a_worker_killed_mid_epoch_is_told_in_a_few_lines_and_the_run_ends_with_its_result(ray_cluster, tmp_path):
    """kill -9 of a Ray Train worker in epoch 2: Ray restarts the group from epoch 1's checkpoint. The console
    names what died (Ray's one line), that the run resumed after epoch 1, and no traceback; one bar, no copy of the
    dead worker's; and the run's last line is still its JSON result."""
    out, err = (tmp_path / "stdout").open("w+"), (tmp_path / "stderr").open("w+")
    run = start([sys.executable, str(ROOT / RAY_DDP), *SMOKE, "--steps-per-epoch", "40", "--num-workers", "2",
                 "--address", ray_cluster, "--checkpoint-dir", str(tmp_path / "runs")], out, err)
    try:
        deadline = time.time() + 240
        while "epoch 1/2 |" not in (tmp_path / "stdout").read_text():
            assert run.poll() is None and time.time() < deadline, (tmp_path / "stderr").read_text()[-3000:]
            time.sleep(0.5)
        time.sleep(1)  # into epoch 2
        workers = subprocess.run(["pgrep", "-f", "ray::RayTrainWorker"], capture_output=True, text=True)
        victim = int(workers.stdout.split()[-1])
        subprocess.run(["kill", f"-{signal.SIGKILL.value}", str(victim)], check=True)
        assert run.wait(timeout=240) == 0
    finally:
        run.kill()
    stdout, stderr = (tmp_path / "stdout").read_text(), (tmp_path / "stderr").read_text()
    console = stdout + stderr
    assert f"Worker PID: {victim}" in console  # Ray says what died
    assert "resumed from" in stdout and "after epoch 1" in stdout
    assert "Traceback" not in console and "(pid=" not in console
    assert stdout.count("epoch 2/2 |") == 1
    assert [h["epoch"] for h in json.loads(stdout.strip().splitlines()[-1])["history"]] == [1, 2]
