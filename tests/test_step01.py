"""Step 01: the single-machine baseline and hand-written DDP under torchrun (gloo, CPU)."""
import json
import os
import re
import shlex
import socket
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from common.model import build_model, count_params
from checks import (assert_same_weights, assert_sane_summary, checkpoint_weights, collectives_per_step, final_json,
                    profile_summary, resumed_after)
from conftest import ACCUMULATE, ROUNDING, SINGLE, SMOKE, ROOT
from early import takes
from hosts import can_make_hosts, hosts
import processes
from processes import python, run, torchrun

DDP = "01-vanilla-pytorch-ddp/train_ddp.py"


def test_single_machine_trains_and_reports(single_run):
    summary, checkpoint_dir, result = single_run
    assert_sane_summary(summary, "single_machine", world_size=1)
    assert f"model tiny: {count_params(build_model('tiny')):,} parameters | data: synthetic" in result.stdout
    assert sum(line.startswith("epoch ") and "| 1 process |" in line for line in result.stdout.splitlines()) == 2
    assert f"checkpoint: {checkpoint_dir / 'checkpoint.pt'}\n" in result.stdout  # where it wrote
    model = build_model("tiny")
    model.load_state_dict(checkpoint_weights(checkpoint_dir))  # the checkpoint loads into a plain model
    assert summary["params"] == sum(p.numel() for p in model.parameters())


def test_ddp_trains_and_reports_once(ddp_run):
    summary, checkpoint_dir, result = ddp_run
    assert_sane_summary(summary, "ddp", world_size=2)
    assert result.stdout.count(f"checkpoint: {checkpoint_dir / 'checkpoint.pt'}\n") == 1  # where it wrote, once
    # Rank 0 alone prints: one header, one line per epoch, one JSON line.
    assert result.stdout.count("parameters | data:") == 1
    assert sum(line.startswith("epoch ") and "| 2 processes |" in line for line in result.stdout.splitlines()) == 2
    assert [h["world_size"] for h in summary["history"]] == [2, 2]
    assert sum(line.startswith("{") for line in result.stdout.splitlines()) == 1


def test_ddp_equals_single_machine_with_the_same_global_batch(single_run, ddp_run):
    """The workshop's 'mathematically equivalent' claim, with gradient accumulation: 2 processes x 2 micro-batches
    of 8 images (no all-reduce on the first) == 1 process x 32 images."""
    assert_same_weights(checkpoint_weights(single_run[1]), checkpoint_weights(ddp_run[1]), atol=ROUNDING)
    single, ddp = single_run[0]["history"], ddp_run[0]["history"]
    assert [h["test_accuracy"] for h in single] == [h["test_accuracy"] for h in ddp]
    np.testing.assert_allclose([h["train_loss"] for h in single], [h["train_loss"] for h in ddp], rtol=1e-5)


@pytest.mark.parametrize("capability", processes.lower_capabilities()[:1])
def test_ddp_equals_single_machine_with_another_processors_kernels(capability, tmp_path):
    """ROUNDING where the arithmetic rounds otherwise: both runs with the kernels held to the lowest capability this
    machine offers (processes.KERNELS), as an older laptop's would, still end within it."""
    kernels = processes.kernels(capability)
    single = python(SINGLE, *SMOKE, "--checkpoint-dir", str(tmp_path / "single"), env=kernels)
    ddp = torchrun(DDP, 2, *SMOKE, *ACCUMULATE, "--checkpoint-dir", str(tmp_path / "ddp"), env=kernels)
    assert single.returncode == ddp.returncode == 0, single.stderr[-2000:] + ddp.stderr[-2000:]
    assert_same_weights(checkpoint_weights(tmp_path / "single"), checkpoint_weights(tmp_path / "ddp"), atol=ROUNDING)


def test_k_micro_batches_equal_one_batch_k_times_the_size(single_run, main_summary, tmp_path):
    """One process, 4 micro-batches of 8 images per optimizer step: the weights of batches of 32, up to rounding.
    Run in this process (it needs no other): its first step, the losses and the accuracies match too."""
    summary, _ = main_summary(SINGLE, *SMOKE, "--grad-accum-steps", "4", "--checkpoint-dir", str(tmp_path))
    assert summary["grad_accum_steps"] == 4
    assert_same_weights(checkpoint_weights(single_run[1]), checkpoint_weights(tmp_path), atol=ROUNDING)
    single = single_run[0]["history"]
    assert [h["test_accuracy"] for h in summary["history"]] == [h["test_accuracy"] for h in single]
    np.testing.assert_allclose([h["train_loss"] for h in summary["history"]], [h["train_loss"] for h in single],
                               rtol=1e-5)


def test_ddp_all_reduces_once_per_optimizer_step_not_once_per_micro_batch(ddp_run):
    """The profiler's count, per rank and optimizer step of 2 micro-batches: tiny's gradients fill 2 DDP buckets, each
    all-reduced once. Without no_sync() on the first micro-batch it would be 4 (tests/test_profiling.py shows DDP
    doubling them). Every rank wrote its trace."""
    summary = profile_summary(ddp_run[1])
    assert collectives_per_step(summary) == [{"all_reduce": 2}, {"all_reduce": 2}]
    assert summary["profiled_steps"] == 2
    assert sorted(p.name for p in (ddp_run[1] / "profile").iterdir()) == ["rank0.json.gz", "rank1.json.gz"]
    assert ddp_run[2].stdout.count("profile: 2 optimizer steps after 2 warm-up steps") == 1


def test_single_machine_resume_equals_uninterrupted(single_run, main_summary, tmp_path):
    """Both runs in this process (it needs no other), to the last bit of the uninterrupted run's weights."""
    flags = [*SMOKE, "--checkpoint-dir", str(tmp_path)]
    with pytest.raises(SystemExit, match="simulated crash of rank 0 after epoch 1"):
        main_summary(SINGLE, *flags, "--fail-at-epoch", "1")
    summary, stdout = main_summary(SINGLE, *flags, "--resume")
    assert resumed_after(stdout) == [1]
    assert [h["epoch"] for h in summary["history"]] == [1, 2]
    assert_same_weights(checkpoint_weights(single_run[1]), checkpoint_weights(tmp_path))


@pytest.mark.timeout(360)  # two runs, each with its own limit
def test_ddp_crash_stops_every_rank_and_resume_equals_uninterrupted(ddp_run, tmp_path):
    flags = [*SMOKE, *ACCUMULATE, "--checkpoint-dir", str(tmp_path)]
    crashed = torchrun(DDP, 2, *flags, "--fail-at-epoch", "1", timeout=120)
    assert crashed.returncode != 0 and "simulated crash of rank 1 after epoch 1" in crashed.stderr
    resumed = torchrun(DDP, 2, *flags, "--resume")
    assert [h["epoch"] for h in final_json(resumed)["history"]] == [1, 2]
    assert_same_weights(checkpoint_weights(ddp_run[1]), checkpoint_weights(tmp_path))


# torchrun's c10d rendezvous otherwise hands the restarted ranks the store of the ranks that died, where gloo can
# read a dead rank's address (README: Restarts); the standalone launch is c10d on this machine.
SEPARATE_STORES = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
RESTARTABLE = {SEPARATE_STORES: "1"}


def test_torchrun_max_restarts_restarts_every_rank_and_they_resume_from_the_scripts_checkpoint(ddp_run, tmp_path):
    """One command: rank 1 dies after epoch 1, torchrun starts both ranks again, they resume after epoch 1 and end
    where an uninterrupted run ends, bit for bit."""
    result = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                  "--max-restarts", "1", str(ROOT / DDP), *SMOKE, *ACCUMULATE, "--checkpoint-dir", str(tmp_path),
                  "--fail-at-epoch", "1"], env=RESTARTABLE, timeout=150)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stderr.count("simulated crash of rank 1 after epoch 1") == 1
    assert result.stdout.count("parameters | data:") == 2  # rank 0's first line, once per start of the group
    assert resumed_after(result.stdout) == [1]  # the restarted rank 0 resumed, after epoch 1
    assert [h["epoch"] for h in final_json(result)["history"]] == [1, 2]
    assert_same_weights(checkpoint_weights(ddp_run[1]), checkpoint_weights(tmp_path))


def test_torchrun_restarts_work_only_without_a_shared_rendezvous_store(monkeypatch):
    """The variable README's restart command sets is the one torch's c10d rendezvous reads (torch 2.14.1): were it
    renamed, the restart above would pass by luck and fail in the room."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    handler = DynamicRendezvousHandler.__new__(DynamicRendezvousHandler)
    assert handler.use_agent_store
    monkeypatch.setenv(SEPARATE_STORES, "1")
    assert not handler.use_agent_store


def test_batch_that_does_not_split_over_ranks_is_one_line_from_rank_0_only():
    result = torchrun(DDP, 2, *SMOKE, "--batch-size", "33", timeout=120)
    assert result.returncode != 0
    # Checked when the flags are parsed, before any work; every rank exits, rank 0 alone says why.
    message = "error: --batch-size 33 does not split evenly over 2 processes; use a multiple of 2"
    assert result.stderr.count(message) == 1
    assert 'train_ddp.py", line' not in result.stderr  # no traceback from the script (torchrun adds its own)


def test_resume_from_another_preset_is_a_one_line_error(single_run, main_error):
    error = main_error(SINGLE, *SMOKE, "--model", "small", "--checkpoint-dir", str(single_run[1]), "--resume")
    assert "holds a --model tiny checkpoint, not small; pass --model tiny or another --checkpoint-dir" in error


def test_resume_of_a_run_that_has_trained_all_its_epochs_is_a_one_line_error(single_run, main_error):
    error = main_error(SINGLE, *SMOKE, "--checkpoint-dir", str(single_run[1]), "--resume")
    assert error == (f"error: {single_run[1] / 'checkpoint.pt'} has already trained 2 of --epochs 2; pass a larger "
                     f"--epochs to train on, or another --checkpoint-dir")


def test_a_one_line_error_is_told_apart_from_the_test_clusters_lines_printed_meanwhile(main_error, monkeypatch):
    """The test cluster's raylets and workers print on this process's stderr whenever they have something to say (a
    disk over 95% full failed the test above once): main_error leaves their lines out, and still fails on a second
    line of the script's own."""
    import conftest

    def script_main(*lines):
        def main():
            print(*lines, sep="\n", file=sys.stderr)
            raise SystemExit("error: the one line")
        return SimpleNamespace(main=main)
    ray_lines = ["\x1b[33m(raylet)\x1b[0m [2026-11-26 23:59:59,000 E 1 1] file_system_monitor.cc:116: /tmp/ray is "
                 "over 95% full", "(RayTrainWorker pid=4242, ip=192.0.2.3) a warning of Ray's"]
    monkeypatch.setattr(conftest, "load_script", lambda script: script_main(*ray_lines))
    assert main_error(SINGLE) == "error: the one line"
    monkeypatch.setattr(conftest, "load_script", lambda script: script_main(*ray_lines, "a line of the script's"))
    with pytest.raises(AssertionError):
        main_error(SINGLE)


def test_missing_checkpoint_is_a_one_line_error(tmp_path, main_error):
    error = main_error(SINGLE, *SMOKE, "--checkpoint-dir", str(tmp_path), "--resume")
    assert error.startswith(f"error: --resume but no checkpoint at {tmp_path}")


def test_corrupt_data_is_a_one_line_error(tmp_path, main_error):
    for name in ("cifar10_train.npz", "cifar10_test.npz"):
        (tmp_path / name).write_bytes(b"garbage")
    error = main_error(SINGLE, "--data-dir", str(tmp_path), "--epochs", "1")
    assert "cifar10_train.npz is corrupt" in error and "delete it" in error


LAUNCHER = "01-vanilla-pytorch-ddp/launch_multinode_ddp.sh"
# 4 epochs: a node is lost after the first. Each of 6 steps, as SMOKE's: over many more steps the float rounding of
# 2 ranks' sums against 1's grows past ROUNDING (80 steps did).
ELASTIC = [*SMOKE[:SMOKE.index("--epochs")], "--epochs", "4", *SMOKE[SMOKE.index("--steps-per-epoch"):]]


@takes(120)  # 71 to 85 s measured (the full suite: 71 s; AMD EPYC Zen 5, 2026-11-28)
def two_nodes_then_one(folder: Path, lane) -> dict:
    """The launcher on two hosts (tests/hosts.py: each its own address, home and /tmp; the checkpoints on a folder
    both mount), one process each, elastic (--nnodes 1:2 --max-restarts 2), c10d rendezvous at host a's address;
    once epoch 1's checkpoint is written, host b (the one that does not hold the rendezvous store) is lost: every
    process on it killed at once. Then, to compare with, the same training on one process from start to end. An
    early run: most of it is the rendezvous waiting 30 s for a node that does not come back."""
    shared = folder / "nfs"
    checkpoints, nodes = shared / "elastic", {}
    shared.mkdir()
    path = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}  # this venv's torchrun
    with hosts(folder, ["a", "b"], shared={"/mnt/shared": shared}) as cluster:
        endpoint = f"{cluster['a'].address}:29500"  # any port: the hosts' own
        for name in ("a", "b"):  # a first: its agent holds the rendezvous store
            launch = shlex.join(["bash", LAUNCHER, "--nnodes", "1:2", "--endpoint", endpoint, "--nproc-per-node", "1",
                                 "--max-restarts", "2", "--", *ELASTIC, "--checkpoint-dir", "/mnt/shared/elastic"])
            with (folder / f"{name}.out").open("w") as out, (folder / f"{name}.err").open("w") as err:
                nodes[name] = lane.start(cluster[name].command(f"cd {ROOT}\nexec {launch}"), env=path, stdout=out,
                                         stderr=err)
            if name == "a":
                wait_until(lambda: accepts(endpoint), "node a's rendezvous store", nodes["a"])
        wait_until((checkpoints / "checkpoint.pt").exists, "epoch 1's checkpoint", nodes["a"])
        cluster["b"].lose()
        nodes["a"].wait(timeout=240)
        nodes["b"].wait(timeout=10)
    fixed = lane.run([sys.executable, str(ROOT / SINGLE), *ELASTIC, "--checkpoint-dir", str(folder / "fixed")],
                     timeout=240)
    output = {name: ((folder / f"{name}.out").read_text(), (folder / f"{name}.err").read_text()) for name in "ab"}
    return dict(returncode=nodes["a"].returncode, output=output, checkpoints=checkpoints, fixed=fixed,
                fixed_dir=folder / "fixed")


def accepts(endpoint: str) -> bool:
    host, port = endpoint.split(":")
    with socket.socket() as connection:
        return connection.connect_ex((host, int(port))) == 0


def wait_until(condition, what: str, process, timeout: float = 120):
    deadline = time.time() + timeout
    while not condition():
        assert process.poll() is None and time.time() < deadline, \
            f"waited for {what}: the node {'ended' if process.poll() is not None else 'is slow'}"
        time.sleep(0.1)


@pytest.mark.skipif(not can_make_hosts(), reason="needs root: network, mount and PID namespaces (tests/hosts.py)")
@pytest.mark.early(run=two_nodes_then_one)
def test_torchrun_across_two_nodes_goes_on_with_one_when_a_node_is_lost_and_resumes_from_the_checkpoint(early_run):
    """--nnodes 1:2: the node left restarts its ranks (torchrun's --max-restarts), a rendezvous of one node forms,
    and train_ddp.py resumes from its checkpoint on 1 process: every epoch trained once, by 2 processes and then 1,
    ending with the weights of a run on one process throughout, up to float rounding (the same global batches)."""
    stdout, stderr = early_run["output"]["a"]
    assert early_run["returncode"] == 0, stderr[-3000:]
    # The summary on the shared folder, named by its path on the hosts
    assert json.loads(stdout.splitlines()[-1])["summary"] == "/mnt/shared/elastic/summary.json"
    summary = json.loads((early_run["checkpoints"] / "summary.json").read_text())
    sizes = [h["world_size"] for h in summary["history"]]
    assert [h["epoch"] for h in summary["history"]] == [1, 2, 3, 4] and re.fullmatch("2+1+", "".join(map(str, sizes)))
    assert resumed_after(stdout) == [sizes.count(2)], stdout[-3000:]  # node a's rank 0, after the node was lost
    assert_same_weights(checkpoint_weights(early_run["fixed_dir"]), checkpoint_weights(early_run["checkpoints"]),
                        atol=ROUNDING)
