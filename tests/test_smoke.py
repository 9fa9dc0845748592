"""The smoke tier (`python -m pytest -m smoke`): every script end to end once, as cheaply as it runs. The full
suite's shared runs crash and restart, resume, accumulate and profile; these do none of that.

The two cores are the limit, so the runs overlap. Step 01 through the multi-node launcher needs no Ray cluster: its
two "nodes" start in the background, niced, when the first test here asks for them. Step 01 on one process is
conftest's single_run, which step 01's tests check too. The runs on the two-node test cluster come first: the sweep's
one worker and step 06's one actor (on single_run's checkpoint) side by side (in the full suite, the sweep is step
05's, which its tests share). Steps 03, 04 and step 02's MLflow variant train in Ray Train's local mode, each a
script's main() in the test process (an interpreter that imports torch and Ray costs more than such a run trains).
The tier has two more tests, each a script's main() in the test process: step 02 in local mode (test_step02.py), and
step 02 with Ray Data on both nodes' CPUs (test_step02_ray_data.py, with the checks of its shards)."""
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from common.model import build_model
from checks import LAST_LINE_MAX, assert_sane_summary, checkpoint_weights, final_json
from conftest import EVAL_IMAGES, RAY_FSDP2, ROOT, SMOKE, TUNE, finished_sweep, forbid_ray
from processes import python, start
from common.rendezvous import free_port

pytestmark = pytest.mark.smoke
LOCAL_MODE = ["--num-workers", "0"]
LAUNCHER = "01-vanilla-pytorch-ddp/launch_multinode_ddp.sh"
MLFLOW = "02-ray-train-ddp/train_ray_ddp_with_mlflow.py"
RAY_FSDP1 = "03-ray-train-fsdp/train_ray_fsdp.py"
INFERENCE = "06-ray-data-inference/batch_inference.py"
RAY_TP = "07-tensor-parallel/train_ray_tp.py"
FINISH_TIMEOUT = 240  # s: the background runs share the 2 cores with each other and with the cluster's runs


class Runs:
    """Commands running in the background, each writing to its own files: not to pipes, which nobody reads until the
    run ends, and a full one would stop the run."""

    def __init__(self, folder: Path):
        self.folder, self.processes, self.logs = folder, {}, []

    def start(self, name, cmd, env=None):
        logs = [open(self.folder / f"{name}.{stream}", "w") for stream in ("out", "err")]
        self.logs += logs
        self.processes[name] = start(cmd, *logs, env=env)

    def finish(self, name):
        """Waits for the run; returns its CompletedProcess and its output folder."""
        returncode = self.processes[name].wait(timeout=FINISH_TIMEOUT)
        stdout, stderr = ((self.folder / f"{name}.{stream}").read_text() for stream in ("out", "err"))
        return subprocess.CompletedProcess(self.processes[name].args, returncode, stdout, stderr), self.folder / name

    def stop(self):
        for process in self.processes.values():
            process.kill()  # if a test failed before it waited for this run
            process.wait()
        for log in self.logs:
            log.close()


@pytest.fixture(scope="module")
def background(tmp_path_factory):
    """Starts the multi-node launcher's two "nodes"."""
    runs = Runs(tmp_path_factory.mktemp("smoke"))
    endpoint = f"127.0.0.1:{free_port()}"
    launcher = ["bash", str(ROOT / LAUNCHER), "--nnodes", "2", "--endpoint", endpoint, "--nproc-per-node", "1"]
    # this venv's torchrun; the two "nodes" share this machine's cores
    path = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    # Niced: the cluster's runs are the tier's critical path (Ray runs its workers at nice 15), and these fill the
    # gaps while those wait on Ray.
    for node in (0, 1):  # the same command on both, as on two machines; the checkpoint on storage both see
        runs.start(f"node{node}", ["nice", "-n", "19", *launcher, "--", *SMOKE, "--checkpoint-dir",
                                   str(runs.folder / "checkpoints")], env=path)
    yield runs
    runs.stop()


@pytest.fixture(scope="module")
def inference(background, ray_cluster, single_run):
    """Step 06 on step 01's checkpoint (conftest's single_run, which step 01's tests check too), in the background:
    started before the sweep, its actor takes the cluster's CPU that the sweep's one worker leaves free, and the two
    run side by side."""
    checkpoint_dir = single_run[1]
    background.start("inference", [sys.executable, str(ROOT / INFERENCE), "--checkpoint", str(checkpoint_dir),
                                   "--data", "synthetic", "--eval-images", str(EVAL_IMAGES), "--address",
                                   ray_cluster, "--out", str(background.folder / "inference")])
    return background


# The runs on the cluster first: the background runs go on meanwhile.
def test_tune_sweep_runs_its_trials_and_reports_them(inference, ray_cluster, early_runs, tmp_path):
    """Alone, the smoke tier sweeps one trial (the recipe's flags): each trial starts three processes (Tune's, Ray
    Train's controller, the worker), the tier's largest cost. In the full suite, step 05's sweep (3 trials, ASHA
    stopping one: test_step05, started with the session) is checked here too, rather than a sweep of its own."""
    if finished_sweep in early_runs:
        (report, sweep, _), samples, epochs = early_runs[finished_sweep].result(), 3, 3
    else:
        sweep, samples, epochs = tmp_path, 1, 1
        report = final_json(python(TUNE, *SMOKE, "--epochs", str(epochs), "--num-workers", "1", "--num-samples",
                                   str(samples), "--address", ray_cluster, "--checkpoint-dir", str(sweep / "runs"),
                                   "--out", str(sweep / "out")))
    assert len(report["trials"]) == samples
    assert all(t["error"] is None and 1 <= t["epochs_run"] <= epochs for t in report["trials"])  # ASHA may stop one
    assert report["best"]["best_accuracy"] == max(t["best_accuracy"] for t in report["trials"]) > 0
    assert (sweep / "out" / "validation_accuracy.png").stat().st_size > 0


def test_batch_inference_reproduces_the_single_machine_runs_accuracy(inference, single_run):
    result, out = inference.finish("inference")
    assert final_json(result)["accuracy"] == single_run[0]["test_accuracy"]  # the same images and weights
    last = result.stdout.strip().splitlines()[-1]  # short, naming the whole summary
    assert len(last) <= LAST_LINE_MAX and json.loads(last)["summary"] == str((out / "summary.json").resolve())
    assert len(pd.read_parquet(out / "predictions")) == EVAL_IMAGES  # one prediction per image


# Then the background runs, most of them finished by now.
def test_single_machine_trains_and_writes_a_checkpoint_that_loads(single_run):
    summary, checkpoint_dir, _ = single_run
    assert_sane_summary(summary, "single_machine", world_size=1)
    build_model("tiny").load_state_dict(checkpoint_weights(checkpoint_dir))


def test_multinode_launcher_joins_two_nodes_and_rank_0_alone_prints(background):
    """Two 'nodes' on localhost, one process each, meeting at one c10d rendezvous endpoint, which numbers the ranks:
    rank 0, which alone prints, is on whichever node it gave rank 0."""
    nodes = [background.finish(f"node{node}")[0] for node in (0, 1)]
    assert all(node.returncode == 0 for node in nodes), [node.stderr[-2000:] for node in nodes]
    [printed] = [node for node in nodes if node.stdout.strip()]
    assert_sane_summary(final_json(printed), "ddp", world_size=2)
    assert printed.stdout.count("parameters | data:") == 1
    assert (background.folder / "checkpoints" / "checkpoint.pt").exists()


@pytest.mark.parametrize("script, step", [(RAY_FSDP1, "ray_fsdp"), (RAY_FSDP2, "ray_fsdp2"), (RAY_TP, "ray_tp")])
def test_ray_steps_train_in_local_mode(script, step, main_summary, monkeypatch, tmp_path):
    """Ray Train's local mode: the training function in the script's own process, no Ray, no checkpoint: the run's
    folder holds its summary alone (step 07's a TP group of 1: its plan applied, nothing split). Step 02's is
    test_step02.py's (in the smoke tier too)."""
    forbid_ray(monkeypatch, "in local mode")
    summary, _ = main_summary(script, *SMOKE, *LOCAL_MODE, "--checkpoint-dir", str(tmp_path))
    assert_sane_summary(summary, step, world_size=1)
    assert [p.name for p in tmp_path.glob("**/*") if p.is_file()] == ["summary.json"]


def test_tracked_variant_logs_every_epoch_in_local_mode(main_summary, monkeypatch, tmp_path):
    import mlflow

    forbid_ray(monkeypatch, "in local mode")
    store, previous = f"sqlite:///{tmp_path / 'mlflow.db'}", mlflow.get_tracking_uri()
    try:
        summary, _ = main_summary(MLFLOW, *SMOKE, *LOCAL_MODE, "--tracking-uri", store, "--checkpoint-dir",
                                  str(tmp_path / "runs"))
    finally:
        mlflow.set_tracking_uri(previous)  # the variant sets this process's
    assert_sane_summary(summary, "ray_ddp_mlflow", world_size=1)
    client = mlflow.MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("ray_ddp_mlflow").experiment_id])
    logged = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "test_accuracy")]
    assert logged == [(h["epoch"], h["test_accuracy"]) for h in summary["history"]]


# The test of the tier that runs each script (module, test). A new script fails the test below until it has one.
TIER = {
    "01-vanilla-pytorch-ddp/train_single_machine.py":
        ("test_smoke", "test_single_machine_trains_and_writes_a_checkpoint_that_loads"),
    "01-vanilla-pytorch-ddp/launch_multinode_ddp.sh":
        ("test_smoke", "test_multinode_launcher_joins_two_nodes_and_rank_0_alone_prints"),
    "01-vanilla-pytorch-ddp/train_ddp.py":
        ("test_smoke", "test_multinode_launcher_joins_two_nodes_and_rank_0_alone_prints"),
    "02-ray-train-ddp/train_ray_ddp.py": ("test_step02", "test_local_mode_trains_in_this_process_without_ray"),
    "02-ray-train-ddp/train_ray_ddp_with_mlflow.py":
        ("test_smoke", "test_tracked_variant_logs_every_epoch_in_local_mode"),
    "02-ray-train-ddp/train_ray_ddp_with_ray_data.py":
        ("test_step02_ray_data",
         "test_it_trains_on_both_nodes_each_worker_on_a_disjoint_shard_in_a_new_order_every_epoch"),
    "03-ray-train-fsdp/train_ray_fsdp.py": ("test_smoke", "test_ray_steps_train_in_local_mode"),
    "04-ray-train-fsdp2/train_ray_fsdp2.py": ("test_smoke", "test_ray_steps_train_in_local_mode"),
    "04-ray-train-fsdp2/will_it_fit.py":
        ("test_will_it_fit", "test_giant_on_8_ranks_answers_in_seconds_without_allocating_it"),
    "05-ray-tune/tune_ray_ddp.py": ("test_smoke", "test_tune_sweep_runs_its_trials_and_reports_them"),
    "06-ray-data-inference/batch_inference.py":
        ("test_smoke", "test_batch_inference_reproduces_the_single_machine_runs_accuracy"),
    "07-tensor-parallel/train_ray_tp.py": ("test_smoke", "test_ray_steps_train_in_local_mode"),
}


# The batch scripts for SLURM, each run by a test of the slurm marker: a cluster to start is no part of the smoke tier.
BATCH = {
    "01-vanilla-pytorch-ddp/slurm_ddp.sbatch":
        ("test_slurm", "test_the_ddp_job_runs_a_launcher_per_node_in_one_process_group"),
    "02-ray-train-ddp/slurm_ray.sbatch":
        ("test_slurm", "test_the_ray_job_starts_a_ray_node_per_slurm_node_and_trains_on_both"),
}


@pytest.mark.parametrize("patterns, tests, marker", [(("0*/*.py", "0*/*.sh"), TIER, "smoke"),
                                                     (("0*/*.sbatch",), BATCH, "slurm")])
def test_every_script_is_run_by_a_test_of_the_tier(patterns, tests, marker):
    scripts = {str(p.relative_to(ROOT)) for pattern in patterns for p in ROOT.glob(pattern)}
    assert set(tests) == scripts, f"give each script a test of the {marker} tier: {sorted(scripts ^ set(tests))}"
    for script, (module_name, name) in tests.items():
        module = importlib.import_module(module_name)
        marks = [getattr(module, "pytestmark", None), *getattr(getattr(module, name, None), "pytestmark", [])]
        assert any(mark and mark.name == marker for mark in marks), f"{script}: {module_name}.{name} is not {marker}"
