"""Step 02's tracked variant (02-ray-train-ddp/train_ray_ddp_with_mlflow.py): one MLflow run per Ray run, across a
worker-group restart and --resume, every epoch logged once with the values of the run's history, the flags as
parameters, the final model as an artifact; and MLflow's UI showing the run (tests/tracking_ui.py)."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from common.model import build_model
from early import takes
from checks import (assert_same_weights, checkpoint_weights, final_json, latest_ray_checkpoint, load_script,
                    registered_epoch, resumed_after)
from conftest import ROOT, SMOKE, parse_only
from processes import descendants

VARIANT = "02-ray-train-ddp/train_ray_ddp_with_mlflow.py"  # mlflow is imported where used: collection stays fast
EXPERIMENT = "ray_ddp_mlflow"  # the variant's STEP
# Epochs long enough for a worker to be killed in the middle of one (SMOKE's 6 steps last a fraction of a second).
LONGER_EPOCHS = ["--steps-per-epoch", "40"]
RUN_TIMEOUT = 480  # s, for one Ray run: importing mlflow in the driver and the workers, on a busy 2-core machine
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """One SQLite store for this module's tests in this process: MLflow creates its tables once, which takes seconds."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@takes(220)  # the full suite: 120 to 150 s (AMD EPYC Zen 5, 2026-11-28, 29); 204, 214 s (AMD EPYC Zen 4, 2026-12-04)
def tracked_runs(folder: Path, lane) -> dict:
    """One tracked run on a Ray of its own, a worker of which is killed (kill -9) early in epoch 2: Ray restarts the
    group from epoch 1's checkpoint. What the store held of it right after, with its last checkpoint's weights; then
    --resume (with a larger --epochs) and what the store holds after; then, where Chromium is, MLflow's UI on the
    store. Started with the session (an early run: early.py): most of it is Ray and MLflow starting up."""
    storage, logs, ui = (folder / name for name in ("ray_ddp_mlflow", "console", "ui"))
    logs.mkdir()
    store = f"sqlite:///{folder / 'mlflow.db'}"
    argv = [*SMOKE, *LONGER_EPOCHS, "--num-workers", "2", "--address", "local", "--checkpoint-dir", str(storage),
            "--tracking-uri", store]
    result, victim = kill_a_worker_in_epoch_2([sys.executable, str(ROOT / VARIANT), *argv], storage, logs,
                                              RUN_TIMEOUT, lane)
    tracked = dict(summary=final_json(result), result=result, victim=victim, argv=argv, ray_run=ray_run_name(storage),
                   tracker=tracker_runs(store), weights=checkpoint_weights(latest_ray_checkpoint(storage)))
    resumed = lane.run([sys.executable, str(ROOT / VARIANT), *argv, "--resume", "--epochs", "3"], RUN_TIMEOUT)
    resume = dict(result=resumed, tracker=tracker_runs(store), weights=checkpoint_weights(latest_ray_checkpoint(
        storage)))
    shown = None  # MLflow's UI, where there is a browser to show it
    if CHROMIUM:
        shown = lane.run([sys.executable, str(ROOT / "tests/tracking_ui.py"), "--tracking-uri", store, "--run",
                          tracked["ray_run"], "--out", str(ui), "--chromium", CHROMIUM], timeout=540)
    return dict(tracked=tracked, resume=resume, ui=(shown, ui))


def ray_run_name(storage: Path) -> str:
    (run,) = [p.name for p in storage.iterdir() if p.is_dir()]
    return run


def tracker_runs(uri: str) -> list[dict]:
    """Every MLflow run of the step's experiment: its tag, name, status, parameters, each metric's history as
    [(step, value)] in logging order, and its model.pt artifact."""
    from mlflow import MlflowClient

    from common.tracking import RAY_RUN_TAG

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = []
    for run in client.search_runs([experiment.experiment_id]):
        with tempfile.TemporaryDirectory() as folder:
            model = torch.load(client.download_artifacts(run.info.run_id, "model.pt", folder), weights_only=True)
        runs.append(dict(id=run.info.run_id, name=run.info.run_name, ray_run=run.data.tags.get(RAY_RUN_TAG),
                         status=run.info.status, params=run.data.params, model=model,
                         metrics={key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
                                  for key in run.data.metrics}))
    return runs


def parsed_flags(*argv) -> dict:
    """The flags that the variant's main() parses from this command line, as MLflow stores parameters (strings),
    without the launch time (not a flag)."""
    _, args = parse_only(VARIANT, *argv)
    return {name: str(value) for name, value in vars(args).items() if name != "launched"}


def history_as_logged(history: list[dict]) -> dict:
    """A run's history (its summary's) as the tracker must hold it: each of the epoch's metrics at step=epoch, once."""
    return {key: [(h["epoch"], h[key]) for h in history] for key in history[0].keys() - {"epoch"}}


def test_a_tracking_uri_that_is_a_folder_or_cannot_be_written_is_one_line_before_any_work(run_main, tmp_path):
    """MLflow 3.17 refuses a folder (its file store); a SQLite store whose folder cannot be made would fail in a
    worker, where Ray would count a failure and retry."""
    (tmp_path / "a-file").write_text("")
    unwritable = tmp_path / "a-file" / "runs"
    for uri, problem in ((str(tmp_path), f"{tmp_path} is a folder; pass sqlite:///{tmp_path}/mlflow.db, or the "
                                         f"http://HOST:PORT of an MLflow server"),
                         (f"sqlite:///{unwritable}/mlflow.db", f"{unwritable} cannot be created or written; pass a "
                                                               f"writable folder")):
        assert run_main(VARIANT, *SMOKE, "--tracking-uri", uri, "--checkpoint-dir", str(tmp_path)) == (
            2, [f"error: argument --tracking-uri: {problem}"])


def test_a_restart_logs_only_the_epochs_the_tracker_lacks(store):
    """The windows around a crash, without Ray: the restarted rank 0 finds the same run by its tag, logs the epochs
    of the restored history that the tracker lacks (the crash came after a checkpoint, before its log), and skips
    an epoch that it retrains but had logged already (the crash came after the log, before Ray had the
    checkpoint): each epoch once, the first values kept."""
    import mlflow
    from mlflow import MlflowClient

    from common.tracking import find_or_create_run, logged_epochs

    variant, previous = load_script(VARIANT), mlflow.get_tracking_uri()
    history = [dict(epoch=e, train_loss=1 / e, test_accuracy=e / 10) for e in (1, 2, 3)]
    mlflow.set_tracking_uri(store)
    try:
        first = find_or_create_run("restarts", "ray_ddp-crashed")
        with mlflow.start_run(run_id=first.info.run_id):
            variant.log_epochs(history[:1], logged_epochs(first))  # then the crash, after epoch 2's checkpoint
        again = find_or_create_run("restarts", "ray_ddp-crashed")
        assert again.info.run_id == first.info.run_id and logged_epochs(again) == {1}
        with mlflow.start_run(run_id=again.info.run_id):
            logged = logged_epochs(again)
            variant.log_epochs(history[:2], logged)  # the restored history: epoch 2 is logged now
            variant.log_epochs(history, logged)  # epoch 3, trained after the restart
        retrained = [*history[:2], dict(history[2], test_accuracy=0.99)]  # had Ray not kept epoch 3's checkpoint
        with mlflow.start_run(run_id=first.info.run_id):
            variant.log_epochs(retrained, logged_epochs(first))
        assert find_or_create_run("restarts", "ray_ddp-other").info.run_id != first.info.run_id
    finally:
        mlflow.set_tracking_uri(previous)
    client = MlflowClient(store)
    for key, logged in history_as_logged(history).items():
        assert [(m.step, m.value) for m in client.get_metric_history(first.info.run_id, key)] == logged


@pytest.mark.early(run=tracked_runs)
def test_one_tracker_run_across_a_worker_group_restart(early_run):
    """One MLflow run for the Ray run, though its worker group crashed and restarted: every epoch logged once,
    with the history's values, the flags as parameters, and the final model, which loads into a plain model."""
    tracked = early_run["tracked"]
    summary, runs = tracked["summary"], tracked["tracker"]
    assert resumed_after(tracked["result"].stdout) == [1]  # the crash and restart did happen
    assert [run["ray_run"] for run in runs] == [tracked["ray_run"]]
    (run,) = runs
    assert run["name"] == tracked["ray_run"] and run["status"] == "FINISHED"
    assert [h["epoch"] for h in summary["history"]] == [1, 2]
    assert run["metrics"] == history_as_logged(summary["history"])
    assert run["params"] == parsed_flags(*tracked["argv"])
    assert run["params"]["steps_per_epoch"] == "40" and run["params"]["model"] == "tiny"
    build_model("tiny").load_state_dict(run["model"])
    assert_same_weights(run["model"], tracked["weights"])


@pytest.mark.early(run=tracked_runs)
def test_a_worker_killed_mid_epoch_is_told_in_a_few_lines_and_the_run_ends_with_its_result(early_run):
    """Step 02's README: a real crash comes mid-epoch, try kill -9 on a ray::RayTrainWorker. Here in the tracked
    variant's run (step 02's, with MLflow's lines added): the console names what died (Ray's one line), that the run
    resumed after epoch 1, and no traceback; one bar, no copy of the dead worker's; and the run's last line is still
    its JSON result."""
    tracked = early_run["tracked"]
    stdout, console = tracked["result"].stdout, tracked["result"].stdout + tracked["result"].stderr
    assert f"Worker PID: {tracked['victim']}" in console  # Ray says what died
    assert resumed_after(stdout) == [1]
    assert "Traceback" not in console and "(pid=" not in console
    assert stdout.count("epoch 2/2 |") == 1
    assert [h["epoch"] for h in tracked["summary"]["history"]] == [1, 2]


@pytest.mark.early(run=tracked_runs)
def test_resume_continues_the_same_tracker_run(early_run):
    """--resume (with a larger --epochs) goes on in the same MLflow run: the new epoch is added once, the earlier
    ones stay as they were, the parameters stay the first launch's (MLflow refuses to change one), and the model
    artifact becomes the resumed run's final model."""
    before, resume = early_run["tracked"]["tracker"][0], early_run["resume"]
    summary = final_json(resume["result"])
    (run,) = resume["tracker"]
    assert run["id"] == before["id"] and run["status"] == "FINISHED"
    assert [h["epoch"] for h in summary["history"]] == [1, 2, 3]
    assert run["metrics"] == history_as_logged(summary["history"])
    assert all(run["metrics"][key][:2] == logged for key, logged in before["metrics"].items())
    assert run["params"] == before["params"] and run["params"]["epochs"] == "2"
    assert_same_weights(run["model"], resume["weights"])


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (apt-get install chromium)")
def test_the_ui_check_finds_a_run_by_its_ray_run_name_and_says_when_the_store_has_no_such_run(store):
    """tests/tracking_ui.py's find_run, on a store that holds one run of the variant's experiment: that run by its
    tag, and a one-line error for a name the store does not hold (not the newest run in its place)."""
    from mlflow import MlflowClient

    from common.tracking import RAY_RUN_TAG

    ui = load_script("tests/tracking_ui.py")
    client = MlflowClient(store)
    experiment_id = client.create_experiment(EXPERIMENT)
    kept = client.create_run(experiment_id, tags={RAY_RUN_TAG: "ray_ddp-kept"})
    client.log_metric(kept.info.run_id, "test_accuracy", 0.3, step=1)
    run, _ = ui.find_run(store, "ray_ddp-kept")
    assert run.info.run_id == kept.info.run_id and run.epochs == 1
    with pytest.raises(SystemExit, match=f"error: no run ray_ddp-absent in experiment {EXPERIMENT}"):
        ui.find_run(store, "ray_ddp-absent")


@pytest.mark.early(run=tracked_runs)
def test_mlflow_ui_shows_the_run(early_run):
    """`mlflow ui` on the store, in headless Chromium: the run's name, every parameter, the last test accuracy, and
    the test accuracy chart with a point per epoch (tests/tracking_ui.py checks them), and a screenshot."""
    result, out = early_run["ui"]
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert (out / "screenshot.png").read_bytes().startswith(b"\x89PNG")
    assert "all of them shown" in (out / "results.md").read_text()


def kill_a_worker_in_epoch_2(cmd, storage: Path, logs: Path, timeout: float,
                             lane) -> tuple[subprocess.CompletedProcess, int]:
    """A Ray step on 2 workers (cmd, whose run folder goes in storage) on a Ray it starts (--address local), one of
    whose workers is killed with kill -9 in epoch 2, the way a real crash comes: as soon as Ray has registered epoch
    1's checkpoint, which a restart resumes from (give the run enough --steps-per-epoch for that to be mid-epoch).
    Started by an early run's lane (early.py). Returns the run once it has ended, and the killed process id."""
    with (logs / "stdout").open("w") as out, (logs / "stderr").open("w") as err:
        run = lane.start(cmd, stdout=out, stderr=err)
        try:
            deadline = time.time() + timeout
            while registered_epoch(storage) < 1:
                assert run.poll() is None and time.time() < deadline, (logs / "stderr").read_text()[-3000:]
                time.sleep(0.2)
            workers = subprocess.run(["pgrep", "-f", "ray::RayTrainWorker"], capture_output=True, text=True,
                                     timeout=30)
            ours = descendants(run.pid)  # its Ray's workers, not those of a test running meanwhile
            victim = [pid for pid in map(int, workers.stdout.split()) if pid in ours][-1]
            os.kill(victim, signal.SIGKILL)
            run.wait(timeout=max(deadline - time.time(), 1))
        finally:
            run.kill()
    stdout, stderr = ((logs / stream).read_text() for stream in ("stdout", "stderr"))
    return subprocess.CompletedProcess(cmd, run.returncode, stdout, stderr), victim
