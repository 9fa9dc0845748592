"""Elastic training, step 04 with --num-workers 1-2: losing a node does not stop the run, and the run grows back
when a node returns. On a Ray cluster of its own, which can lose a node (the session's cannot): a head node with no
CPUs, where the script's driver and Ray Train's controller run and survive, and two worker nodes of 1 CPU each."""
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from common.meter import summary_of
from early import takes
from checks import (assert_same_weights, checkpoint_weights, final_json, latest_ray_checkpoint, registered_epoch,
                    resumed_after)
from conftest import RAY_FSDP2, ROOT, ROUNDING, SMOKE

# Epoch 1 on 2 workers; 1 worker from the loss of a node until the group grows back, which it decides a few seconds
# after the node returns (RESIZE_CHECK_INTERVAL_S and TICK_S below); then 2 again to the end. Short epochs (3 steps,
# evaluated on SMOKE's 64 images), paced by the controller's poll: a worker's report waits for the poll that takes
# the one before, so one epoch per poll at most, on a fast machine as on a loaded one. On a 2-core Zen 5 the group
# grew back 12 s after the node returned, its 1 worker having trained 1 epoch; 10 epochs leave room for 6 on 1
# worker, so the run cannot end before the group grows back on a slower machine either.
EPOCHS = 10
POLL_S = 3
TRAINING = [*SMOKE, "--epochs", str(EPOCHS), "--steps-per-epoch", "3"]
SINGLE = "01-vanilla-pytorch-ddp/train_single_machine.py"  # the same training on one process, fixed
RESIZE_CHECK_INTERVAL_S = 1  # Ray's default is 60 s: the group would grow back a minute after the node returns
# Ray Data's autoscaling coordinator, which tells Ray Train's elastic policy what the cluster holds, looks every 20 s
# (_AutoscalingCoordinatorActor.TICK_INTERVAL_S, a class constant): the test cluster starts its own, quicker.
TICK_S = 1
EPOCH_LINE = re.compile(r"epoch (\d+)/\d+ \| (\d+) process")
TERMINAL_CODES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # colours, and the cursor moves of Ray's progress bars
# The cluster, in a process of its own: Ray's Cluster.add_node works in a main thread only, and Cluster.shutdown
# resets Ray's globals in its process (those of this one's driver on the session cluster, if it has one). It adds or
# removes a worker node at each line on its stdin, and answers each with "done". Its argument: the coordinator's tick.
CLUSTER = """
import sys

import ray
from ray.cluster_utils import Cluster
from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import _AutoscalingCoordinatorActor
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

class QuickCoordinator(_AutoscalingCoordinatorActor):
    TICK_INTERVAL_S = float(sys.argv[1])

node = dict(num_cpus=1, object_store_memory=100 * 2**20)
cluster = Cluster(initialize_head=True, head_node_args=dict(node, num_cpus=0, include_dashboard=False))
workers = [cluster.add_node(**node) for _ in range(2)]
cluster.wait_for_nodes()
# Ray Train's elastic policy creates this actor if it does not exist, under this name, on the driver's node (the head).
ray.init(address=cluster.address, logging_level="ERROR")
head = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
coordinator = ray.remote(num_cpus=0, max_restarts=-1)(QuickCoordinator).options(
    name="AutoscalingCoordinator", namespace="AutoscalingCoordinator", lifetime="detached", scheduling_strategy=head)
ray.get(coordinator.remote().__ray_ready__.remote())
print("address", cluster.address, flush=True)
for command in sys.stdin:
    if command.strip() == "remove":
        cluster.remove_node(workers.pop())
    else:
        workers.append(cluster.add_node(**node))
    print("done", flush=True)
cluster.shutdown()
"""


class ElasticCluster:
    """The CLUSTER process: its address, and the commands "remove" and "add", each answered once done."""

    def __init__(self, log: Path, lane):
        self.log = log
        self.process = lane.start([sys.executable, "-c", CLUSTER, str(TICK_S)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=log.open("w"))
        self.address = self.answer("address").split()[1]

    def answer(self, word: str) -> str:
        for line in self.process.stdout:
            if line.startswith(word):
                return line.strip()
        raise AssertionError(f"the test cluster's process ended: {self.log.read_text()[-3000:]}")

    def command(self, command: str) -> None:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        self.answer("done")

    def shutdown(self) -> None:
        self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.terminate()
            self.process.wait()


class Output:
    """The script's output, read line by line in a thread while the test removes and adds nodes, each line with
    its time since the start."""

    def __init__(self, process):
        self.lines, self.start = [], time.time()
        self.thread = threading.Thread(target=self.read, args=(process,), daemon=True)
        self.thread.start()

    def __getstate__(self):  # what the test reads, once the run has ended: not the thread
        return dict(lines=self.lines, start=self.start)

    def read(self, process):
        for line in process.stdout:
            self.lines.append((time.time() - self.start, TERMINAL_CODES.sub("", line.rstrip("\n"))))

    def epochs(self) -> list[tuple[float, int, int]]:
        """(seconds, epoch, processes) of every epoch line so far, repeats included."""
        return [(t, int(m[1]), int(m[2])) for t, line in list(self.lines) if (m := EPOCH_LINE.search(line))]

    def text(self) -> str:
        return "\n".join(f"[{t:6.1f} s] {line}" for t, line in self.lines)


def wait_for(condition, what: str, process, output, timeout=240):
    deadline = time.time() + timeout
    while not condition():
        if process.poll() is not None or time.time() > deadline:
            raise AssertionError(f"waited for {what}; the run {'ended' if process.poll() is not None else 'is slow'}"
                                 f"\n{output.text()[-6000:]}")
        time.sleep(0.2)


@takes(160)  # the full suite: 91 and 90 s (AMD EPYC Zen 5, 2026-11-28); 108 and 156 s (AMD EPYC Zen 4, 2026-12-04)
def elastic_run(folder: Path, lane) -> dict:
    """The elastic run, started with the session (an early run: early.py; most of it is waiting for polls): epochs
    on 2 workers, a node removed once epoch 1's checkpoint is registered, epochs on 1, the node added back, then 2
    again to the end. Its exit code, its output, the timeline of what was done to it, and the fixed-size run."""
    cluster = ElasticCluster(folder / "cluster.log", lane)
    storage = folder / "elastic"
    process = lane.start([sys.executable, str(ROOT / RAY_FSDP2), *TRAINING, "--num-workers", "1-2", "--address",
                          cluster.address, "--checkpoint-dir", str(storage)],
                         env={"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": str(POLL_S),
                              "RAY_TRAIN_ELASTIC_MONITOR_INTERVAL_S": str(RESIZE_CHECK_INTERVAL_S)},
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output, events = Output(process), {}
    try:
        # Two workers train an epoch; once the controller has registered its checkpoint, a node goes.
        wait_for(lambda: any(n == 2 for _, _, n in output.epochs()), "an epoch on 2 workers", process, output)
        last = output.epochs()[-1][1]
        wait_for(lambda: registered_epoch(storage) >= last, f"epoch {last}'s checkpoint", process, output)
        cluster.command("remove")
        events["node removed"] = time.time() - output.start
        # The run goes on, on 1 worker, from the last checkpoint; then a node comes back.
        wait_for(lambda: any(n == 1 for _, _, n in output.epochs()), "an epoch on 1 worker", process, output)
        cluster.command("add")
        events["node added"] = time.time() - output.start
        # Meanwhile, the same training on one process from start to end, to compare with.
        fixed = lane.run([sys.executable, str(ROOT / SINGLE), *TRAINING, "--checkpoint-dir", str(folder / "fixed")],
                         timeout=300)
        events["fixed-size run done"] = time.time() - output.start
        wait_for(lambda: process.poll() is not None, "the end of the run", process, output, timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        output.thread.join(timeout=10)
        cluster.shutdown()
    return dict(returncode=process.returncode, output=output, events=events, storage=storage, fixed=fixed,
                fixed_dir=folder / "fixed")


@pytest.mark.early(run=elastic_run)
def test_losing_a_node_does_not_stop_the_run_and_it_grows_back_when_the_node_returns(early_run):
    output, storage = early_run["output"], early_run["storage"]
    print(f"\n{output.text()}\n{early_run['events']}")  # the timeline, with pytest -s
    assert early_run["returncode"] == 0, output.text()[-6000:]
    fixed = final_json(early_run["fixed"])
    summary = summary_of(json.loads([line for _, line in output.lines if line.startswith("{")][-1]))
    # Every epoch trained once in the run's history, by 2 workers, then 1, then 2 again.
    history = [(h["epoch"], h["world_size"]) for h in summary["history"]]
    assert [epoch for epoch, _ in history] == list(range(1, EPOCHS + 1)), history
    sizes = "".join(str(size) for _, size in history)
    assert re.fullmatch(r"2+1+2+", sizes), history
    # Each epoch's last printed line names the workers that trained it (a group resized before it registered an
    # epoch's checkpoint trains that epoch again: its line then shows twice).
    assert {epoch: n for _, epoch, n in output.epochs()} == dict(history)
    assert summary["world_size"] == 2 and summary["nodes"] == 2
    # Each resize restarted the group from the last checkpoint: of the last epoch trained at the size before.
    resumed = resumed_after("\n".join(line for _, line in output.lines))
    assert resumed == [epoch for (epoch, size), (_, after) in zip(history, history[1:], strict=False) if size != after]
    # Each epoch's global batches are the same at any size (the sampler's seed and epoch fix the order), and each
    # resize resumed the model, AdamW and the schedule: the run ends with the weights of a run that never resized, up
    # to float rounding, as step 04's resume from 1 worker to 2 ends with DDP's (test_step04).
    assert_same_weights(checkpoint_weights(early_run["fixed_dir"]),
                        torch.load(latest_ray_checkpoint(storage) / "model.pt", weights_only=True), atol=ROUNDING)
    np.testing.assert_allclose([h["train_loss"] for h in summary["history"]],
                               [h["train_loss"] for h in fixed["history"]], rtol=1e-4)
