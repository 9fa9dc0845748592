"""Step 02: Ray Train DDP on a real two-node Ray cluster (on this machine), fault tolerance and resume; Ray Train's
local mode."""
import pytest
import ray
import ray.train
import torch

from common.model import build_model
from checks import (EPOCH_FIELDS, assert_same_weights, assert_sane_summary, assert_short_last_line, checkpoint_weights,
                    collectives_per_step, final_json, latest_ray_checkpoint, profile_summary, reported_metrics,
                    resumed_after)
from conftest import ACCUMULATE, RAY_DDP, SMOKE, forbid_ray
from processes import torchrun


def test_ray_ddp_trains_on_two_nodes_and_reports(ray_run):
    summary, storage, result = ray_run
    assert_sane_summary(summary, "ray_ddp", world_size=2)
    assert summary["nodes"] == 2  # one worker on each node of the cluster
    # DDP: every rank holds the whole model, its gradients and AdamW's two moments.
    full_mb = summary["params"] * 4 / 2**20
    for memory in summary["memory_per_rank"]:
        assert memory["params_mb"] == memory["grads_mb"] == pytest.approx(full_mb)
        assert memory["optimizer_mb"] == pytest.approx(2 * full_mb, rel=1e-3)  # + one step counter per tensor
    assert "memory per rank (MB)" in result.stdout
    # Rank 0 alone prints, each time the training function starts: in the first worker group and the restarted one.
    assert result.stdout.count("parameters | data:") == 2
    # and once only: Ray Train's print patch would echo each worker line again on stderr
    assert (result.stdout + result.stderr).count("epoch 2/2 |") == 1
    assert "best checkpoint" in result.stdout
    checkpoint = latest_ray_checkpoint(storage)
    assert ray.train.Checkpoint(str(checkpoint)).get_metadata() == {"model_preset": "tiny", "epoch": 2}
    build_model("tiny").load_state_dict(checkpoint_weights(checkpoint))


def test_a_restarted_runs_summary_covers_the_whole_run(ray_run):
    """images/s over every epoch, the one before the crash included; every epoch in the history, and there only the
    epoch's own fields (the start-up is the run's, common/meter.py, tested in test_meter.py); the report carried the
    epoch's metrics alone; the last line is short and names the whole summary, in the run's folder."""
    summary, storage, result = ray_run
    history = summary["history"]
    seconds = sum(h["epoch_time_s"] for h in history)
    assert summary["images_per_s"] == pytest.approx(sum(h["images_per_s"] * h["epoch_time_s"] for h in history)
                                                    / seconds)
    assert [h["epoch"] for h in history] == [1, 2]
    assert all(h.keys() == EPOCH_FIELDS for h in history), history
    run_folder = latest_ray_checkpoint(storage).parent
    assert [m.keys() for m in reported_metrics(run_folder)] == [EPOCH_FIELDS] * 2
    assert_short_last_line(result.stdout, summary, run_folder)


def test_ray_ddp_all_reduces_as_torchrun_ddp_does(ray_run, ddp_run):
    """The same buckets, each all-reduced once per optimizer step of 2 micro-batches, on every Ray worker."""
    assert collectives_per_step(profile_summary(ray_run[1])) == collectives_per_step(profile_summary(ddp_run[1]))


def test_ray_ddp_equals_torchrun_ddp(ray_run, ddp_run):
    """Bit for bit, crash and restart included: the restarted group resumed the model, AdamW, the schedule and the
    data order exactly."""
    assert_same_weights(checkpoint_weights(ddp_run[1]), checkpoint_weights(latest_ray_checkpoint(ray_run[1])))
    assert [h["test_accuracy"] for h in ray_run[0]["history"]] == [h["test_accuracy"] for h in ddp_run[0]["history"]]


def test_crashed_worker_is_restarted_from_the_last_checkpoint(ray_run):
    """Fails if FailureConfig(max_failures) is taken out: the crash would end the run."""
    summary, _, result = ray_run
    assert resumed_after(result.stdout) == [1]  # not from scratch
    assert result.stdout.count("epoch 1/2 |") == 1 and result.stdout.count("epoch 2/2 |") == 1
    assert [h["epoch"] for h in summary["history"]] == [1, 2]


def test_resume_with_another_preset_is_refused_before_ray_starts(ray_run, main_error):
    """Checked by the driver: inside a worker the error would count as a failure and be retried."""
    error = main_error(RAY_DDP, *SMOKE, "--checkpoint-dir", str(ray_run[1]), "--resume", "--model", "small")
    assert "holds a --model tiny checkpoint, not small; pass --model tiny" in error


@pytest.mark.parametrize("flags, message", [
    (["--num-workers", "4"], "--num-workers 4 needs 4 CPUs, the cluster has 2; use --num-workers 2 or fewer"),
    (["--use-gpu"], "--use-gpu but this Ray cluster has no GPUs; drop --use-gpu"),
])
def test_requests_the_cluster_cannot_hold_fail_at_once_with_one_line(cluster_main_error, tmp_path, flags, message):
    error = cluster_main_error(RAY_DDP, *SMOKE, "--checkpoint-dir", str(tmp_path), *flags)
    # No run started: nothing written (its name claimed an empty folder, which the script removes as it exits).
    assert message in error and not any(path.is_file() for path in tmp_path.rglob("*"))


def test_unreachable_address_is_a_one_line_error(tmp_path, main_error):
    error = main_error(RAY_DDP, *SMOKE, "--address", "127.0.0.1:9", "--checkpoint-dir", str(tmp_path))
    assert error.startswith("error: no Ray cluster answers at --address 127.0.0.1:9")


@pytest.mark.smoke
def test_local_mode_trains_in_this_process_without_ray(main_summary, monkeypatch, tmp_path):
    """--num-workers 0, Ray Train's local mode: train_func runs here, in the test's own process (where breakpoint()
    would stop), with no Ray started, and keeps no checkpoint: its folder holds the run's summary alone. It trains what
    Ray's one worker would. (The smoke tier's run of step 02.)"""
    forbid_ray(monkeypatch, "in local mode")
    summary, stdout = main_summary(RAY_DDP, *SMOKE, "--num-workers", "0", "--checkpoint-dir", str(tmp_path))
    assert_sane_summary(summary, "ray_ddp", world_size=1)
    assert "best checkpoint" not in stdout
    assert [p.name for p in tmp_path.glob("**/*") if p.is_file()] == ["summary.json"]


@pytest.mark.parametrize("flag, gpu, machine", [("--use-gpu", False, "no"), ("--no-gpu", True, "the")])
def test_local_mode_against_the_machines_gpu_is_a_one_line_error(flag, gpu, machine, main_error, monkeypatch, tmp_path):
    """Local mode trains on this machine's GPU if it has one: --use-gpu without one, or --no-gpu with one, is refused
    before any work, not silently ignored."""
    forbid_ray(monkeypatch, "in local mode")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    error = main_error(RAY_DDP, *SMOKE, "--num-workers", "0", flag, "--checkpoint-dir", str(tmp_path))
    assert error == f"error: --num-workers 0 (local mode) trains on {machine} GPU of this machine; drop --use-gpu " \
                    f"and --no-gpu"


def test_local_mode_under_torchrun_trains_as_torchrun_ddp_does(ddp_run, tmp_path):
    """torchrun starts the processes, Ray Train's local mode gives each the same ray.train API and a process group:
    the same run as step 01's torchrun DDP, to the last digit of every loss and accuracy."""
    result = torchrun(RAY_DDP, 2, *SMOKE, *ACCUMULATE, "--num-workers", "0", "--checkpoint-dir", str(tmp_path))
    local, ddp = final_json(result), ddp_run[0]
    assert local["world_size"] == 2 and result.stdout.count("parameters | data:") == 1  # rank 0 alone speaks
    assert [(h["train_loss"], h["test_accuracy"]) for h in local["history"]] == [
        (h["train_loss"], h["test_accuracy"]) for h in ddp["history"]]
