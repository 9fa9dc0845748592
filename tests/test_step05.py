"""Step 05: a Ray Tune sweep whose trials are Ray Train runs of step 02's loop. The script's two whole sweeps are early
runs (early.py), each on a Ray of its own: 3 trials on two nodes, each restarted after a crash while ASHA stops one;
1 trial errored, resumed, interrupted and resumed. What runs in this process uses the shared two-node Ray test
cluster (1 CPU per node)."""
import json
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import ray
import ray.tune
from ray.train import ScalingConfig
from ray.train.torch import TorchTrainer
from ray.tune.error import TuneError
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

from common.flags import make_parser
from common.sweep import FreeStoppedTrialsWorkers, noise_command, train_command
from early import takes
from checks import LAST_LINE_MAX, final_json, load_script, resumed_after
from conftest import ROOT, SMOKE, TUNE, finished_sweep, parse_only


def tune_results(sweep_dir) -> dict:
    """Each trial's validation accuracies as Tune recorded them (its result.json), not as the script tabulates."""
    accuracies = {}
    for result_file in Path(sweep_dir).glob("run_trial_*/result.json"):
        results = [json.loads(line) for line in result_file.read_text().splitlines()]
        accuracies[results[0]["trial_id"]] = [r["test_accuracy"] for r in results]
    return accuracies


@pytest.mark.early(run=finished_sweep)
def test_each_trial_profiles_into_its_own_run_folder(early_run):
    """--profile-steps: a trace per rank in each trial's run folder, beside its checkpoints (where
    step 02 alone would write them: under --checkpoint-dir, outside the sweep)."""
    report, tmp_path, _ = early_run
    runs = sorted(Path(report["sweep"]).glob("train-*"))
    assert len(runs) == 3
    for run in runs:
        assert sorted(p.name for p in (run / "profile").iterdir()) == ["rank0.json.gz", "rank1.json.gz"]
    assert not list((tmp_path / "runs").glob("train-*"))


@pytest.mark.timeout(60)
@pytest.mark.early(run=finished_sweep)
def test_every_trial_reports_and_the_best_is_the_most_accurate(early_run):
    report = early_run[0]
    recorded = tune_results(report["sweep"])
    assert sorted(recorded) == [t["trial_id"] for t in report["trials"]] and len(recorded) == 3
    for trial in report["trials"]:
        assert trial["error"] is None and trial["epochs_run"] == len(recorded[trial["trial_id"]])
        assert trial["best_accuracy"] == max(recorded[trial["trial_id"]])
    best = max(recorded, key=lambda trial_id: max(recorded[trial_id]))
    assert report["best"]["trial_id"] == best
    assert report["best"]["best_accuracy"] > 0.2  # 6 steps on the synthetic classes beat chance (10%) clearly
    # Trial 0 trains the flags as given (SMOKE's lr, the recipe's warmup and decay): the sweep's yardstick.
    smoke_lr = float(SMOKE[SMOKE.index("--lr") + 1])
    assert report["trials"][0]["searched"] == f"--lr {smoke_lr:g} --warmup-epochs 1 --weight-decay 0.05"
    assert len({t["searched"] for t in report["trials"]}) == 3


@pytest.mark.early(run=finished_sweep)
def test_asha_stopped_a_trial_behind_at_epoch_2_and_the_next_trial_got_its_cpus(early_run):
    """One trial at a time (2 workers on 2 CPUs), in trial order. At epoch 2 ASHA stops a trial below the median of
    the trials before it there, and only such a trial; a stopped trial ran 2 epochs, the others all 3. The sweep
    finished, so the trial after the stopped one got its CPUs."""
    report, _, result = early_run
    trials = report["trials"]  # in trial order, the order they ran
    at_epoch_2 = [t["history"][1]["validation_accuracy"] for t in trials]
    for i, trial in enumerate(trials):
        behind = i > 0 and at_epoch_2[i] < np.median(at_epoch_2[:i])
        assert trial["stopped_early"] == behind and trial["epochs_run"] == (2 if behind else 3), (trial, at_epoch_2)
    assert trials[1]["stopped_early"], (
        f"trial 1 ended epoch 2 at {at_epoch_2[1]:.2%}, not behind trial 0 ({at_epoch_2[0]:.2%}): ASHA had nothing "
        f"to stop; pick another SWEEP_SEED")
    assert f"trial {trials[1]['trial_id']}: stopped by ASHA after epoch 2" in result.stdout
    assert trials[2]["epochs_run"] >= 2  # the trial after it trained, on the CPUs the stopped one held


@pytest.mark.early(run=finished_sweep)
def test_each_trials_group_spans_both_nodes_and_restarts_after_its_crash_while_asha_stops_another(early_run):
    """--fail-at-epoch 1: a worker of each trial crashes after epoch 1, and Ray Train restarts the trial's group from
    epoch 1's checkpoint (FailureConfig, within the trial), in the sweep in which ASHA stops trial 1 (above). Each
    trial's group starts twice, each time on both nodes."""
    report, _, result = early_run
    assert resumed_after(result.stdout) == [1, 1, 1], result.stdout[-3000:]
    assert re.findall(r"\| 2 x cpu on (\d+) node\(s\)", result.stdout) == ["2"] * 6
    assert [[h["epoch"] for h in t["history"]] for t in report["trials"]] == [[1, 2, 3], [1, 2], [1, 2, 3]]


@pytest.mark.early(run=finished_sweep)
def test_the_sweep_writes_its_table_plot_and_a_command_that_trains_the_winner(early_run):
    report, tmp_path, result = early_run
    table = (tmp_path / "out" / "results.md").read_text()
    assert all(t["trial_id"] in table for t in report["trials"]) and report["best"]["searched"] in table
    assert (tmp_path / "out" / "validation_accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    command = shlex.split(report["train_command"])
    assert command[:2] == ["python", "01-vanilla-pytorch-ddp/train_single_machine.py"]
    flags = make_parser("", "single_machine").parse_args(command[2:])  # step 01's flags, all of them known
    assert flags.data == "cifar10" and flags.steps_per_epoch is None  # the whole training set, full epochs
    best = report["best"]["config"]
    assert (flags.lr, flags.warmup_epochs, flags.weight_decay) == pytest.approx(
        (best["lr"], best["warmup_epochs"], best["weight_decay"]), rel=1e-3)
    assert report["train_command"] in result.stdout
    last = result.stdout.strip().splitlines()[-1]  # short, naming the whole report
    assert len(last) <= LAST_LINE_MAX
    assert json.loads(last)["summary"] == str((tmp_path / "out" / "results.json").resolve())


@takes(190)  # the full suite: 103 to 122 s (AMD EPYC Zen 5, 2026-11-28); 160 and 181 s (AMD EPYC Zen 4, 2026-12-04)
def errored_sweep(folder: Path, lane) -> dict:
    """A sweep of one trial on 1 worker, three times, each on a Ray it starts on this machine, as on a laptop
    (--address local). Its worker crashes after epoch 1 with no restart left (--max-failures 0): the trial errors and
    the sweep ends. --resume runs the errored trial again, from epoch 1's checkpoint, and is interrupted after its
    second epoch (SIGUSR1, which Tune handles as it does Ctrl-C; a run in the background may ignore SIGINT). --resume
    again finishes it."""
    command = [sys.executable, str(ROOT / TUNE), *SMOKE, "--epochs", "4", "--steps-per-epoch", "20",
               "--num-workers", "1", "--num-samples", "1", "--fail-at-epoch", "1", "--max-failures", "0",
               "--address", "local", "--checkpoint-dir", str(folder / "runs"), "--out", str(folder / "out")]
    errored = lane.run(command, timeout=300)
    with (folder / "interrupted.err").open("w") as stderr:  # a file: a full pipe, unread, would stop the run
        process, before = lane.start([*command, "--resume"], stdout=subprocess.PIPE, stderr=stderr), []
        for line in process.stdout:
            before.append(line)
            if "epoch 2/4, validation accuracy" in line:
                process.send_signal(signal.SIGUSR1)
                break
        stdout, _ = process.communicate(timeout=300)
    interrupted = subprocess.CompletedProcess(command, process.returncode, "".join(before) + stdout,
                                              (folder / "interrupted.err").read_text())
    return dict(errored=errored, interrupted=interrupted, resumed=lane.run([*command, "--resume"], timeout=300))


@pytest.mark.early(run=errored_sweep)
def test_an_errored_trial_resumes_from_its_checkpoint_and_an_interrupted_sweep_resumes(early_run):
    """A trial out of restarts ends the sweep in one line that says to --resume; --resume runs the errored trial again
    (resume_errored: Tune would leave it failed) from epoch 1's checkpoint, which Ray Train finds by the trial run's
    name. Interrupted after its second epoch, the sweep says so in one line; --resume finishes the trial from a
    checkpoint the interrupted run wrote, and the table counts every epoch once."""
    errored, interrupted, resumed = early_run["errored"], early_run["interrupted"], early_run["resumed"]
    assert errored.returncode != 0 and "error: 1 trial(s) failed (see above); run the same command with --resume" \
        in errored.stderr, errored.stdout[-3000:] + errored.stderr[-3000:]
    assert resumed_after(errored.stdout) == []
    assert resumed_after(interrupted.stdout) == [1], interrupted.stdout[-3000:] + interrupted.stderr[-3000:]
    assert interrupted.returncode != 0 and "was interrupted; run the same command with --resume" in interrupted.stderr
    [trial] = final_json(resumed)["trials"]
    # Ray Train resumed the trial's run from its newest checkpoint: epoch 2's, or 3's if the worker got that far
    # while Tune was stopping.
    assert resumed_after(resumed.stdout) in ([2], [3])
    assert trial["error"] is None and [h["epoch"] for h in trial["history"]] == [1, 2, 3, 4]


def test_a_stopped_trials_workers_are_freed_once_its_trial_has_ended(ray_driver, tmp_path):
    """Ray keeps a stopped trial's workers' placement group (and their CPUs) until the sweep's job ends; the sweep
    removes it, but only once the trial's own group is gone, and with it the controller that could restart them."""
    free = FreeStoppedTrialsWorkers(tmp_path)
    trial, workers = placement_group([{"memory": 2**20}]), placement_group([{"CPU": 1}])
    ray.get([trial.ready(), workers.ready()])
    (tmp_path / "train-t1").mkdir()
    (tmp_path / "train-t1" / "placement_groups").write_text(f"{trial.id.hex()} {workers.id.hex()}")
    free.on_trial_complete(0, [], SimpleNamespace(trial_id="t1"))
    free.on_step_begin(0, [])
    assert placement_group_table(workers)["state"] == "CREATED"  # the trial is still ending
    remove_placement_group(trial)
    free.on_step_begin(0, [])
    assert placement_group_table(workers)["state"] == "REMOVED" and not free.stopped


def built_sweep(monkeypatch, tmp_path, *flags) -> dict:
    """What the sweep hands ray.tune.Tuner for these flags (param_space, tune_config, run_config); no Tune runs."""
    tune_script = load_script(TUNE)
    _, args = parse_only(TUNE, *SMOKE, *flags, "--checkpoint-dir", str(tmp_path))
    built = {}
    monkeypatch.setattr(ray.tune, "Tuner", lambda trainable, **options: built.update(options))
    monkeypatch.setattr(tune_script, "trials_at_once", lambda num_workers, use_gpu: 2)
    tune_script.new_sweep(args, False, tmp_path / "sweep", trainable=None)
    return built


def sweep_scheduler(monkeypatch, tmp_path, *flags):
    """The ASHA scheduler and TuneConfig that the sweep builds from these flags, as Tune sets them up; no Tune runs."""
    config = built_sweep(monkeypatch, tmp_path, *flags)["tune_config"]
    config.scheduler.set_search_properties(config.metric, config.mode)  # as Tune does
    return config.scheduler


def test_asha_stops_the_trial_behind_at_the_grace_period_never_the_one_ahead(monkeypatch, tmp_path):
    """Step 02's reports, {"epoch", "test_accuracy"}, into the sweep's own scheduler (--grace-period 2): before epoch
    2 no trial stops, however far behind; at epoch 2 the first trial there goes on, one behind it stops and one ahead
    of both goes on."""
    asha = sweep_scheduler(monkeypatch, tmp_path, "--epochs", "4", "--grace-period", "2", "--num-samples", "5")
    reports = [("slow", 1, 0.50), ("early", 1, 0.01), ("first", 2, 0.40), ("behind", 2, 0.20), ("ahead", 2, 0.60)]
    decisions = {}
    for name, epoch, accuracy in reports:
        trial = SimpleNamespace(trial_id=name)
        asha.on_trial_add(None, trial)
        decisions[name] = asha.on_trial_result(None, trial, {"epoch": epoch, "test_accuracy": accuracy})
    assert decisions == {"slow": "CONTINUE", "early": "CONTINUE", "first": "CONTINUE", "behind": "STOP",
                         "ahead": "CONTINUE"}


def test_asha_may_stop_a_trial_after_its_last_epochs_report_which_still_counts_it_finished(monkeypatch, tmp_path):
    """--epochs 2, --grace-period 1: ASHA's rungs are at epochs 1 and 2, so the trial behind at epoch 2, its last,
    gets STOP after that report (05-ray-tune/README.md says so). It has trained every epoch: describe_trial counts
    it finished, not stopped early."""
    asha = sweep_scheduler(monkeypatch, tmp_path, "--epochs", "2", "--grace-period", "1", "--num-samples", "2")
    decisions = []
    for name, epoch, accuracy in [("a", 1, 0.5), ("b", 1, 0.6), ("a", 2, 0.5), ("b", 2, 0.4)]:
        trial = SimpleNamespace(trial_id=name)
        if epoch == 1:
            asha.on_trial_add(None, trial)
        decisions.append(asha.on_trial_result(None, trial, {"epoch": epoch, "test_accuracy": accuracy}))
    assert decisions == ["CONTINUE", "CONTINUE", "CONTINUE", "STOP"]


def step01_parses(capsys, command: str) -> str:
    """The command's flags through step 01's own parser and its checks (check_flags), stopped before any work: the
    error line it prints, or '' if it accepts them."""
    words = shlex.split(command)
    assert words[:2] == ["python", "01-vanilla-pytorch-ddp/train_single_machine.py"]
    try:
        parse_only(words[1], *words[2:])
    except SystemExit:
        return capsys.readouterr().err.strip()
    return ""


@pytest.mark.parametrize("epochs", [1, 2])
def test_the_winners_printed_commands_parse_whatever_warmup_the_sweep_drew(epochs, monkeypatch, capsys, tmp_path):
    """The README's sweep ran 1 epoch while the warmup was drawn up to 1.5: trials warmed up for longer than they
    trained, and the winner's printed command was refused (--warmup-epochs longer than --epochs). Every warmup the
    sweep's own search space can draw is now at most --epochs, reached, and both printed commands parse."""
    SEARCH_SPACE = load_script(TUNE).SEARCH_SPACE
    space = built_sweep(monkeypatch, tmp_path, "--epochs", str(epochs), "--grace-period", "1",
                        "--data-dir", str(tmp_path / "data"))["param_space"]
    assert space["epochs"] == epochs
    rng = np.random.default_rng(0)
    drawn = [{key: value.sample(random_state=rng) if isinstance(value, ray.tune.search.sample.Domain) else value
              for key, value in space.items()} for _ in range(200)]
    warmups = {config["warmup_epochs"] for config in drawn}
    assert max(warmups) == min(epochs, 1.5) and min(warmups) == 0.25, warmups
    for warmup in sorted(warmups):
        config = next(c for c in drawn if c["warmup_epochs"] == warmup)
        for command in (train_command(config, SEARCH_SPACE), noise_command(config, SEARCH_SPACE)):
            assert step01_parses(capsys, command) == "", command
    # and the check it passes is the one that refused the old commands:
    too_long = dict(config, warmup_epochs=epochs + 0.5)
    assert "--warmup-epochs" in step01_parses(capsys, train_command(too_long, SEARCH_SPACE))


@pytest.mark.upstream
def test_the_train_v1_pattern_no_longer_works():
    """Ray's behaviour that 05-ray-tune/README.md claims ("the V1 snippet ... fails with `TuneError: Improper 'run' -
    not string nor trainable`", and the top-level README): under Train V2, Ray 2.60's default, a TorchTrainer is no
    longer a Tune trainable."""
    trainer = TorchTrainer(lambda config: None, scaling_config=ScalingConfig(num_workers=1))
    with pytest.raises(TuneError, match="Improper 'run' - not string nor trainable"):
        ray.tune.Tuner(trainer, param_space={"train_loop_config": {"lr": ray.tune.grid_search([1e-3, 2e-3])}})


def test_more_workers_than_the_cluster_holds_fail_in_one_line_before_any_trial(cluster_main_error, tmp_path):
    """Checked once Ray is up (test_flags checks the flags that fail before it, --data cifar10 among them)."""
    error = cluster_main_error(TUNE, *SMOKE, "--num-workers", "3", "--batch-size", "48",
                               "--checkpoint-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "out"))
    assert error == "error: --num-workers 3 needs 3 CPUs, the cluster has 2; use --num-workers 2 or fewer"
    # Tune never started: nothing written (the sweep's name claimed an empty folder, which goes as the script exits)
    assert not any(path.is_file() for path in (tmp_path / "runs").rglob("*"))
