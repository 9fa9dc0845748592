"""The smoke tier's own runs (`python -m pytest -m smoke`): every script once, end to end, as cheaply as it runs.
The full suite's shared runs crash and restart, resume, accumulate and profile; these do none of that. What needs
no Ray cluster runs in Ray Train's local mode, in this process: no interpreter to start, no worker group to wait
for. Step 01's two runs and the Ray Data variant are smoke tests in their own modules (test_step01.py,
test_step02_ray_data.py)."""
import json

import pandas as pd
import pytest

from common import build_model
from conftest import (EVAL_IMAGES, RAY_DDP, RAY_FSDP2, SMOKE, assert_sane_summary, final_json, latest_ray_checkpoint,
                      load_weights, python, ray_script)

pytestmark = pytest.mark.smoke
LOCAL_MODE = ["--num-workers", "0"]


def test_ray_ddp_trains_on_two_nodes_and_keeps_its_best_checkpoint(ray_cluster, tmp_path):
    result = ray_script(RAY_DDP, ray_cluster, tmp_path)
    summary = final_json(result)
    assert_sane_summary(summary, "ray_ddp", world_size=2)
    assert summary["nodes"] == 2 and result.stdout.count("parameters | data:") == 1
    best = max(summary["history"], key=lambda epoch: epoch["test_accuracy"])
    assert f"(epoch {best['epoch']}, test acc {best['test_accuracy']:.2%})" in result.stdout
    build_model("tiny").load_state_dict(load_weights(latest_ray_checkpoint(tmp_path)))


def test_fsdp1_trains_in_local_mode(main_summary, tmp_path):
    summary, stdout = main_summary("03-ray-train-fsdp/train_ray_fsdp.py", *SMOKE, *LOCAL_MODE, "--checkpoint-dir",
                                   str(tmp_path))
    assert_sane_summary(summary, "ray_fsdp", world_size=1)
    assert stdout.splitlines()[0].startswith("FSDP1: on CPUs, FullyShardedDataParallel by hand")


def test_fsdp2_trains_in_local_mode(main_summary, tmp_path):
    summary, stdout = main_summary(RAY_FSDP2, *SMOKE, *LOCAL_MODE, "--checkpoint-dir", str(tmp_path))
    assert_sane_summary(summary, "ray_fsdp2", world_size=1)
    (memory,) = summary["memory_per_rank"]  # one rank holds the whole model: its shard is all of it
    assert memory["params_mb"] == pytest.approx(summary["params"] * 4 / 2**20)


def test_tracked_variant_logs_every_epoch_in_local_mode(main_summary, tmp_path):
    from mlflow import MlflowClient

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    summary, stdout = main_summary("02-ray-train-ddp/train_ray_ddp_with_mlflow.py", *SMOKE, *LOCAL_MODE,
                                   "--checkpoint-dir", str(tmp_path / "runs"), "--tracking-uri", store)
    assert_sane_summary(summary, "ray_ddp", world_size=1)
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("ray_ddp").experiment_id])
    logged = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "test_accuracy")]
    assert logged == [(h["epoch"], h["test_accuracy"]) for h in summary["history"]]


def test_tune_sweep_reports_every_trial_and_the_best(ray_cluster, tmp_path):
    result = python("05-ray-tune/tune_ray_ddp.py", *SMOKE, "--num-workers", "1", "--num-samples", "2",
                    "--grace-period", "2", "--address", ray_cluster, "--checkpoint-dir", str(tmp_path / "runs"),
                    "--out", str(tmp_path / "out"))
    report = final_json(result)
    assert [t["epochs_run"] for t in report["trials"]] == [2, 2] and all(t["error"] is None for t in report["trials"])
    assert report["best"]["best_accuracy"] == max(t["best_accuracy"] for t in report["trials"]) > 0.2
    assert json.loads((tmp_path / "out" / "results.json").read_text())["best"] == report["best"]


def test_batch_inference_reproduces_the_single_machine_runs_accuracy(ray_cluster, single_run, tmp_path):
    summary, checkpoint_dir, _ = single_run
    result = python("06-ray-data-inference/batch_inference.py", "--checkpoint", str(checkpoint_dir), "--data",
                    "synthetic", "--eval-images", str(EVAL_IMAGES), "--address", ray_cluster, "--out", str(tmp_path))
    assert final_json(result)["accuracy"] == summary["test_accuracy"]  # the same images and weights as the run
    assert len(pd.read_parquet(tmp_path / "predictions")) == EVAL_IMAGES  # one prediction per image
