"""Which checkpoints a Ray run keeps and calls its best (steps 02 to 04, and step 06, which classifies with the best),
and which run --resume continues when the checkpoint folder holds several (every Ray step: common.runs.run_name)."""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray
import ray.train

from common import runs
from common.runs import run_name
from checks import best_epoch, load_script
from conftest import RAY_DDP, RAY_FSDP2, ROOT, SMOKE, forbid_ray

RAY_STEPS = [RAY_DDP, "02-ray-train-ddp/train_ray_ddp_with_ray_data.py", "03-ray-train-fsdp/train_ray_fsdp.py",
             RAY_FSDP2]
# Test accuracy per epoch of a scripted run: the best is epoch 2, the best two 2 and 4, the newest two 3 and 4, and
# the worst two 1 and 3: whichever rule picks the kept checkpoints, it shows.
ACCURACIES = [0.3, 0.5, 0.1, 0.4]


class Built(Exception):
    """Raised by a stand-in TorchTrainer, to stop a step's main() once it has built its trainer."""


def run_configs(monkeypatch, cluster_driver, tmp_path) -> dict:
    """Each Ray step's RunConfig as its main() builds it, on the test cluster; nothing trains."""
    def record(train_func, **options):
        raise Built(options["run_config"])

    configs = {}
    for script in RAY_STEPS:
        module = load_script(script)
        monkeypatch.setattr(module, "TorchTrainer", record)
        monkeypatch.setattr(sys, "argv", [script, "--data", "synthetic", "--model", "tiny", "--address", cluster_driver,
                                          "--checkpoint-dir", str(tmp_path / Path(script).stem)])
        with pytest.raises(Built) as built:
            module.main()
        configs[script] = built.value.args[0]
    return configs


def scripted_training(accuracies=tuple(ACCURACIES)):
    """A training function to stand in for a step's, nested: Ray ships it by value, without this module."""
    def scripted_run(config):
        """Stands in for a step's train_func, in every worker: reports the accuracies as the steps report their epochs
        (the metrics; the summary the driver prints, in the run's folder; a checkpoint from rank 0 with the preset and
        epoch in its metadata)."""
        import json
        import tempfile

        context, history = ray.train.get_context(), []
        run_folder = Path(config["checkpoint_dir"], context.get_experiment_name())
        for epoch, accuracy in enumerate(accuracies, 1):
            history.append(dict(epoch=epoch, train_loss=1.0 / epoch, test_accuracy=accuracy))
            summary = dict(step="scripted", world_size=1, model="tiny", train_loss=1.0 / epoch,
                           test_accuracy=accuracy, images_per_s=1.0, history=history,
                           memory_per_rank=[dict(params_mb=1.0, grads_mb=1.0, optimizer_mb=2.0, peak_mb=100.0)])
            with tempfile.TemporaryDirectory() as folder:
                checkpoint = None
                if context.get_world_rank() == 0:
                    (run_folder / "summary.json").write_text(json.dumps(summary))
                    Path(folder, "epoch.txt").write_text(str(epoch))
                    checkpoint = ray.train.Checkpoint.from_directory(folder)
                    checkpoint.set_metadata(dict(model_preset="tiny", epoch=epoch))
                ray.train.report(history[-1], checkpoint=checkpoint)

    return scripted_run


def test_a_run_keeps_its_two_most_accurate_checkpoints_and_step06_classifies_with_the_best(cluster_driver, main_summary,
                                                                                          tmp_path, monkeypatch,
                                                                                          capsys):
    """Step 02's main() with a scripted training function: Ray keeps the checkpoints of epochs 2 and 4 (the two most
    accurate), the run names epoch 2's its best, and step 06, given the run, picks epoch 2's. Steps 02 (Ray Data),
    03 and 04 build the same CheckpointConfig, so they keep and pick the same."""
    configs = run_configs(monkeypatch, cluster_driver, tmp_path)
    assert len({repr(config.checkpoint_config) for config in configs.values()}) == 1, configs

    step02 = load_script(RAY_DDP)
    monkeypatch.setattr(step02, "train_func", scripted_training())
    _, stdout = main_summary(RAY_DDP, "--data", "synthetic", "--model", "tiny", "--epochs", "4", "--num-workers", "1",
                             "--address", cluster_driver, "--checkpoint-dir", str(tmp_path / "scripted"), module=step02)
    [run] = (tmp_path / "scripted").iterdir()
    kept = {int((checkpoint / "epoch.txt").read_text()): checkpoint for checkpoint in run.glob("checkpoint_*/")}
    assert sorted(kept) == [2, 4]
    assert f"best checkpoint {kept[2]} (epoch 2, test acc 50.00%)" in stdout

    best = load_script("06-ray-data-inference/batch_inference.py").find_checkpoint(run)
    assert best == kept[2]
    assert f"best checkpoint by test accuracy: {kept[2]} (epoch 2, test acc 50.00%)" in capsys.readouterr().out


def test_of_tied_accuracies_ray_calls_the_latest_epoch_best_as_the_tests_expect(cluster_driver, main_summary, tmp_path,
                                                                                 monkeypatch):
    """Scored on few images, two epochs often tie: the tests' best_epoch must name the epoch Ray calls best (a test
    that took the first of a tie failed now and then)."""
    step02 = load_script(RAY_DDP)
    monkeypatch.setattr(step02, "train_func", scripted_training((0.25, 0.5, 0.5)))
    summary, stdout = main_summary(RAY_DDP, "--data", "synthetic", "--model", "tiny", "--epochs", "3", "--num-workers",
                                   "1", "--address", cluster_driver, "--checkpoint-dir", str(tmp_path), module=step02)
    assert "(epoch 3, test acc 50.00%)" in stdout  # Ray's best checkpoint, as the run prints it
    assert best_epoch(summary["history"])["epoch"] == 3  # the tests' choice, from the run's own history


def test_two_runs_started_in_the_same_second_get_two_names(tmp_path, monkeypatch):
    """The second would otherwise restore the first. Local mode keeps no checkpoint, so claims no folder; a URI has no
    folder to claim, and the process id tells two launches apart."""
    monkeypatch.setattr(runs.time, "strftime", lambda fmt: "20261126-120000")
    args = argparse.Namespace(resume=False, checkpoint_dir=str(tmp_path), num_workers=2)
    names = [run_name("ray_ddp", args) for _ in range(3)]
    assert names == ["ray_ddp-20261126-120000", "ray_ddp-20261126-120000-2", "ray_ddp-20261126-120000-3"]
    assert sorted(p.name for p in tmp_path.iterdir()) == names
    local = argparse.Namespace(resume=False, checkpoint_dir=str(tmp_path / "local"), num_workers=0)
    assert run_name("ray_ddp", local) == "ray_ddp-20261126-120000" and not (tmp_path / "local").exists()
    uri = argparse.Namespace(resume=False, checkpoint_dir="s3://bucket/runs", num_workers=2)
    assert run_name("ray_ddp", uri) == f"ray_ddp-20261126-120000-{runs.os.getpid()}"
    resume = argparse.Namespace(resume=True, checkpoint_dir=str(tmp_path), model="tiny", epochs=2)
    assert run_name("ray_ddp", resume) == "ray_ddp-20261126-120000-3"  # the newest


def test_each_ray_script_names_its_runs_after_itself(monkeypatch):
    """Two scripts sharing a --checkpoint-dir: --resume of one never continues the other's run."""
    steps = {script: load_script(script).STEP for script in
             [*RAY_STEPS, "02-ray-train-ddp/train_ray_ddp_with_mlflow.py", "05-ray-tune/tune_ray_ddp.py"]}
    assert len(set(steps.values())) == len(steps), steps


def test_every_process_of_a_ray_steps_job_asks_its_own_cluster_not_the_newest_on_the_machine(ray_cluster):
    """Train's placement-group cleaner asks Ray's state API, without an address, whether the controller lives: with
    another Ray started later on the machine (a test cluster, `ray start`) that then stopped, the query timed out and
    a Ray traceback reached the attendee's console. The steps' job (worker_setup()) names its own cluster in every
    process, here a task's; and its setup hook leaves torch unimported, so that the task trains with as many threads
    as it has CPUs (1), as Ray sets them after the hook (the runs of steps 02 and 01 then end equal bit for bit)."""
    driver = ("import os, ray, common\nfrom common.ray_setup import worker_setup\n"
              f"ray.init(address={ray_cluster!r}, runtime_env={{'py_modules': [common], **worker_setup()}})\n"
              "print(ray.get_runtime_context().gcs_address)\n"
              "def job():\n    import torch\n    return os.environ.get('RAY_ADDRESS'), torch.get_num_threads()\n"
              "print(*ray.get(ray.remote(num_cpus=1)(job).remote()))\n")
    environment = {name: value for name, value in os.environ.items() if name != "RAY_ADDRESS"}
    result = subprocess.run([sys.executable, "-c", driver], env=environment, capture_output=True, text=True,
                            timeout=120)
    own, seen, threads = result.stdout.split()[-3:]
    assert seen == own and own.endswith(ray_cluster.rpartition(":")[2]), result.stderr[-2000:]
    assert threads == "1"


def test_the_summary_stays_the_last_line_when_ray_prints_later(ray_cluster, tmp_path):
    """Ray's driver prints its workers' lines, and its raylets' warnings, whenever they arrive: a raylet's "N
    PYTHON worker processes have been started" once came after a step's JSON summary, which the benchmarks read as
    the run's last line. The Ray steps end with ray.shutdown(), then print_run_summary: a task that prints 1 s after
    that, as a step's main() does it: nothing of it may follow."""
    summary = dict(step="late", world_size=1, model="tiny", train_loss=2.0, test_accuracy=0.5, images_per_s=9.0,
                   memory_per_rank=[dict(params_mb=1, grads_mb=1, optimizer_mb=2, peak_mb=9)])
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    for script in sorted(ROOT.glob("0[2-4]-*/train_*.py")):
        source = script.read_text()
        assert source.index("    ray.shutdown()") < source.index("    print_run_summary("), script
    driver = ("import time, ray\nfrom common.meter import print_run_summary\n"
              f"ray.init(address={ray_cluster!r}, logging_level='ERROR')\n"
              "@ray.remote(num_cpus=0)\ndef late():\n    time.sleep(1)\n    print('late line', flush=True)\n"
              "ray.get(ray.remote(num_cpus=0)(lambda: None).remote())\n"  # a worker ready, whose prints reach us
              f"task = late.remote()\nray.shutdown()\nprint_run_summary({str(tmp_path)!r}, time.time())\n"
              "time.sleep(4)\n")
    result = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert json.loads(result.stdout.splitlines()[-1])["step"] == "late", result.stdout[-2000:] + result.stderr[-2000:]


def make_run(folder: Path, preset: str = "tiny", epoch: int = 1) -> Path:
    """A Ray run folder with one checkpoint, as steps 02 to 04 leave it after an epoch."""
    checkpoint = folder / "checkpoint_000000"
    checkpoint.mkdir(parents=True)
    ray.train.Checkpoint(str(checkpoint)).set_metadata(dict(model_preset=preset, epoch=epoch))
    return folder


def test_resume_continues_the_newest_run_whatever_order_the_folders_were_written_in(tmp_path):
    """Runs are named after the time they started; --resume takes the newest of this step's runs, not the first
    listed, nor another step's, nor a file; and checks the preset of that run's checkpoint."""
    for name in ("ray_ddp-20260101-120000", "ray_ddp-20261231-235959", "ray_ddp-20251231-235959",
                 "ray_ddp-20260615-080000", "ray_fsdp2-20270101-000000"):
        make_run(tmp_path / name, preset="small" if name == "ray_ddp-20261231-235959" else "tiny")
    (tmp_path / "ray_ddp-20991231-000000.log").write_text("not a run")
    args = argparse.Namespace(resume=True, checkpoint_dir=str(tmp_path), model="small", epochs=2)
    assert run_name("ray_ddp", args) == "ray_ddp-20261231-235959"
    with pytest.raises(SystemExit, match=r"ray_ddp-20261231-235959/checkpoint_000000 holds a --model small "
                                         r"checkpoint, not tiny"):
        run_name("ray_ddp", argparse.Namespace(resume=True, checkpoint_dir=str(tmp_path), model="tiny", epochs=2))
    assert run_name("ray_fsdp2", argparse.Namespace(**dict(vars(args), model="tiny"))) == "ray_fsdp2-20270101-000000"
    # The same runs under a URI, read as Ray reads --checkpoint-dir (pyarrow's filesystems; s3:// in test_cluster.py)
    assert run_name("ray_ddp", argparse.Namespace(**dict(vars(args), checkpoint_dir=tmp_path.as_uri()))) == \
        "ray_ddp-20261231-235959"


def test_resume_with_no_run_is_a_one_line_error_before_ray_starts(tmp_path, main_error, monkeypatch):
    forbid_ray(monkeypatch, "for a --resume with nothing to resume")
    for folder in (str(tmp_path), tmp_path.as_uri()):  # a folder, or a URI
        assert main_error(RAY_DDP, *SMOKE, "--checkpoint-dir", folder, "--resume") == (
            f"error: --resume but no ray_ddp run in {folder}; run without --resume to start fresh")
