"""The smoke tier (`python -m pytest -m smoke`): every script end to end once, as cheaply as it runs. The full
suite's shared runs crash and restart, resume, accumulate and profile; these do none of that.

Two lines of runs side by side. The runs that need no Ray cluster (step 01 on one process and through the
multi-node launcher; step 02, its MLflow variant, 03 and 04 in Ray Train's local mode) start together, in the
background, when the first test here asks for them: they keep the CPUs busy while the runs on the two-node test
cluster (step 02 with Ray Data, the step 05 sweep, step 06) spend most of their time waiting on Ray."""
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from common import build_model
from conftest import (EVAL_IMAGES, RAY_DDP, RAY_FSDP2, ROOT, SINGLE, SMOKE, assert_sane_summary, final_json,
                      free_port, latest_ray_checkpoint, load_weights, python, ray_script, start)

pytestmark = pytest.mark.smoke
LOCAL_MODE = ["--num-workers", "0"]
LAUNCHER = "01-vanilla-pytorch-ddp/launch_multinode_ddp.sh"
MLFLOW = "02-ray-train-ddp/train_ray_ddp_with_mlflow.py"
RAY_DATA = "02-ray-train-ddp/train_ray_ddp_with_ray_data.py"
FINISH_TIMEOUT = 240  # s: the background runs share the 2 cores with each other and with the cluster's runs


@pytest.fixture(scope="module")
def background(tmp_path_factory):
    """Starts every run that needs no Ray cluster; finish(name) waits for one and returns (CompletedProcess, its
    output folder)."""
    tmp = tmp_path_factory.mktemp("smoke")
    endpoint = f"127.0.0.1:{free_port()}"
    launcher = ["bash", str(ROOT / LAUNCHER), "--nnodes", "2", "--endpoint", endpoint, "--nproc-per-node", "1"]
    # this venv's torchrun; the two "nodes" share this machine's cores
    path = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    commands = {
        "single": [sys.executable, str(ROOT / SINGLE), *SMOKE],
        **{f"node{rank}": [*launcher, "--node-rank", str(rank), "--", *SMOKE] for rank in (0, 1)},
        "ray_ddp": [sys.executable, str(ROOT / RAY_DDP), *SMOKE, *LOCAL_MODE],
        "fsdp1": [sys.executable, str(ROOT / "03-ray-train-fsdp/train_ray_fsdp.py"), *SMOKE, *LOCAL_MODE],
        "fsdp2": [sys.executable, str(ROOT / RAY_FSDP2), *SMOKE, *LOCAL_MODE],
        "mlflow": [sys.executable, str(ROOT / MLFLOW), *SMOKE, *LOCAL_MODE, "--tracking-uri",
                   f"sqlite:///{tmp / 'mlflow.db'}"],
    }
    # Output to files, not pipes: nobody reads a pipe until the run ends, and a full one would stop the run.
    logs = {name: (open(tmp / f"{name}.out", "w"), open(tmp / f"{name}.err", "w")) for name in commands}
    runs = {name: start([*cmd, "--checkpoint-dir", str(tmp / name)], *logs[name],
                        env=path if name.startswith("node") else None) for name, cmd in commands.items()}

    def finish(name):
        returncode = runs[name].wait(timeout=FINISH_TIMEOUT)
        stdout, stderr = ((tmp / f"{name}.{stream}").read_text() for stream in ("out", "err"))
        return subprocess.CompletedProcess(runs[name].args, returncode, stdout, stderr), tmp / name
    yield finish
    for name, run in runs.items():
        run.kill()  # if a test failed before it waited for this run
        run.wait()
        for log in logs[name]:
            log.close()


# The runs on the cluster first: the background runs go on meanwhile.
def test_ray_data_feeds_two_workers_on_two_nodes(background, ray_cluster, tmp_path):
    result = ray_script(RAY_DATA, ray_cluster, tmp_path)
    summary = final_json(result)
    assert_sane_summary(summary, "ray_ddp_data", world_size=2)
    assert summary["nodes"] == 2 and result.stdout.count("parameters | data:") == 1  # rank 0 alone prints
    best = max(summary["history"], key=lambda epoch: epoch["test_accuracy"])
    assert f"(epoch {best['epoch']}, test acc {best['test_accuracy']:.2%})" in result.stdout
    build_model("tiny").load_state_dict(load_weights(latest_ray_checkpoint(tmp_path)))


def test_tune_sweep_reports_every_trial_and_the_best(background, ray_cluster, tmp_path):
    result = python("05-ray-tune/tune_ray_ddp.py", *SMOKE, "--epochs", "1", "--num-workers", "1", "--num-samples",
                    "2", "--address", ray_cluster, "--checkpoint-dir", str(tmp_path / "runs"), "--out",
                    str(tmp_path / "out"))
    report = final_json(result)
    assert [t["epochs_run"] for t in report["trials"]] == [1, 1] and all(t["error"] is None for t in report["trials"])
    assert report["best"]["best_accuracy"] == max(t["best_accuracy"] for t in report["trials"])
    assert (tmp_path / "out" / "validation_accuracy.png").stat().st_size > 0


def test_batch_inference_reproduces_the_single_machine_runs_accuracy(background, ray_cluster, tmp_path):
    result, checkpoint_dir = background("single")
    summary = final_json(result)
    inference = python("06-ray-data-inference/batch_inference.py", "--checkpoint", str(checkpoint_dir), "--data",
                       "synthetic", "--eval-images", str(EVAL_IMAGES), "--address", ray_cluster, "--out",
                       str(tmp_path))
    assert final_json(inference)["accuracy"] == summary["test_accuracy"]  # the same images and weights as the run
    assert len(pd.read_parquet(tmp_path / "predictions")) == EVAL_IMAGES  # one prediction per image


# Then the background runs, most of them finished by now.
def test_single_machine_trains_and_writes_a_checkpoint_that_loads(background):
    result, checkpoint_dir = background("single")
    summary = final_json(result)
    assert_sane_summary(summary, "single_machine", world_size=1)
    build_model("tiny").load_state_dict(load_weights(checkpoint_dir))


def test_multinode_launcher_joins_two_nodes_and_rank_0_alone_prints(background):
    """Two 'nodes' on localhost, one process each, rendezvous through node 0's endpoint."""
    (node0, checkpoint_dir), (node1, _) = background("node0"), background("node1")
    assert node1.returncode == 0, node1.stderr[-2000:]
    summary = final_json(node0)
    assert_sane_summary(summary, "ddp", world_size=2)
    assert node0.stdout.count("parameters | data:") == 1 and node1.stdout.strip() == ""
    assert (checkpoint_dir / "checkpoint.pt").exists()


@pytest.mark.parametrize("name, step", [("ray_ddp", "ray_ddp"), ("fsdp1", "ray_fsdp"), ("fsdp2", "ray_fsdp2")])
def test_ray_steps_train_in_local_mode(background, name, step):
    """Ray Train's local mode: the training function in the script's own process, no Ray cluster, no checkpoint."""
    result, checkpoint_dir = background(name)
    assert_sane_summary(final_json(result), step, world_size=1)
    assert not checkpoint_dir.exists() or not any(checkpoint_dir.iterdir())


def test_tracked_variant_logs_every_epoch_in_local_mode(background):
    from mlflow import MlflowClient

    result, _ = background("mlflow")
    summary = final_json(result)
    assert_sane_summary(summary, "ray_ddp", world_size=1)
    client = MlflowClient(result.args[result.args.index("--tracking-uri") + 1])
    (run,) = client.search_runs([client.get_experiment_by_name("ray_ddp").experiment_id])
    logged = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "test_accuracy")]
    assert logged == [(h["epoch"], h["test_accuracy"]) for h in summary["history"]]
