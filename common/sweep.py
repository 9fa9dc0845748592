"""What step 05's sweep needs beyond its lesson: a workaround for the workers of the trials that ASHA stops, a line per
trial and epoch, and the sweep's table, plot and commands. The lesson (a search space, a trial that builds a
TorchTrainer, ASHA, the best trial) stays in 05-ray-tune/tune_ray_ddp.py."""
import json
import shlex
import sys
import time
from pathlib import Path

import ray
import ray.train
import ray.tune
from ray.util.placement_group import PlacementGroup


def check_sweep_flags(parser, args):
    """The sweep's own flags, checked like the others (make_parser's): one line, before any work."""
    if args.data == "cifar10":
        parser.error("--data cifar10 would tune on the test set, which would then no longer "
                     "measure anything; tune on --data cifar10-val (the last 5,000 training "
                     "images, held out)")
    if args.num_samples < 1:
        parser.error(f"--num-samples {args.num_samples} must be at least 1")
    if not 1 <= args.grace_period <= args.epochs:
        parser.error(f"--grace-period {args.grace_period} must be between 1 and "
                     f"--epochs {args.epochs}")
    if "://" in args.checkpoint_dir:
        parser.error(f"--checkpoint-dir {args.checkpoint_dir} must be a local or mounted folder: "
                     f"each trial notes its placement groups there for the sweep to read")


def note_placement_groups(config) -> None:
    """In every worker of a trial's run: rank 0 notes the placement groups of its trial and of its run's workers, for
    FreeStoppedTrialsWorkers."""
    if ray.train.get_context().get_world_rank() == 0:
        workers = ray.util.get_current_placement_group().id.hex()
        Path(config["run_dir"], "placement_groups").write_text(f"{config['trial_placement_group']} {workers}")


class FreeStoppedTrialsWorkers(ray.tune.Callback):
    """Tune stops a trial (ASHA's decision) by ending its actor, which ends the trial's Ray Train
    controller and workers, but not their placement group: Ray ties a placement group to the job
    (this script) that made it, and Ray Train's own cleaner asks the dashboard's State API, which
    ray[train] does not install. Left alone, a stopped trial would hold its workers' CPUs until the
    sweep ends, and the next trial would wait for them forever on a small cluster. So once a stopped
    trial's own placement group is gone (Tune has ended its actor, and with it the controller that
    could restart workers), its workers' group is removed here."""

    def __init__(self, sweep: Path):
        self.sweep, self.stopped = sweep, set()

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.stopped.add(trial.trial_id)

    on_trial_error = on_trial_complete

    def on_step_begin(self, iteration, trials, **info):
        for trial_id in list(self.stopped):
            noted = self.sweep / f"train-{trial_id}" / "placement_groups"
            if noted.exists():  # else the trial stopped before its workers started
                trial, workers = (PlacementGroup(ray.PlacementGroupID.from_hex(h))
                                  for h in noted.read_text().split())
                if state(trial) != "REMOVED":
                    continue  # Tune is still ending the trial's actor
                if state(workers) not in ("REMOVED", None):  # None: Ray has forgotten it
                    ray.util.remove_placement_group(workers)
            self.stopped.discard(trial_id)

    def on_experiment_end(self, trials, **info):
        """The last trials to stop, before this script goes on
        (a shared cluster gets its CPUs back)."""
        deadline = time.monotonic() + 60
        while self.stopped and time.monotonic() < deadline:
            time.sleep(0.5)
            self.on_step_begin(0, trials)


def state(group: PlacementGroup) -> str | None:
    return ray.util.placement_group_table(group).get("state")


class PrintTrialProgress(ray.tune.Callback):
    """One line per trial and epoch: Tune's own reporter prints every metric of every report."""

    def __init__(self, searched):
        self.searched = searched

    def on_trial_result(self, iteration, trials, trial, result, **info):
        print(f"trial {trial.trial_id} ({flags(trial.config, self.searched)}): "
              f"epoch {result['epoch']}/{trial.config['epochs']}, "
              f"validation accuracy {result['test_accuracy']:.2%}", flush=True)

    def on_trial_complete(self, iteration, trials, trial, **info):
        epochs = trial.last_result.get("epoch", 0)
        print(f"trial {trial.trial_id}: " + ("done" if epochs == trial.config["epochs"] else
                                             f"stopped by ASHA after epoch {epochs}"), flush=True)

    def on_trial_error(self, iteration, trials, trial, **info):
        print(f"trial {trial.trial_id}: failed, see {trial.error_file}", flush=True)


def flags(config: dict, searched) -> str:
    return " ".join(f"--{key.replace('_', '-')} {config[key]:g}" for key in searched)


def describe_trial(result, sweep: Path, searched) -> dict:
    """A row of the table: step 02's own history of the trial (whole, where Tune's record of a
    resumed trial starts again: the summary.json in its run's folder), up to the last epoch Tune
    recorded (a stopped trial's run may report once more while Tune ends it, which ASHA never
    saw)."""
    frame, config = result.metrics_dataframe, result.config
    seen = 0 if frame is None or frame.empty else int(frame["epoch"].max())
    history = []
    if seen:
        run = sweep / f"train-{frame['trial_id'].iloc[0]}"
        history = [h for h in json.loads((run / "summary.json").read_text())["history"]
                   if h["epoch"] <= seen]
    return dict(trial_id=frame["trial_id"].iloc[0] if seen else Path(result.path).name,
                searched=flags(config, searched), config=config,
                best_accuracy=max((h["test_accuracy"] for h in history), default=None),
                epochs_run=len(history),
                # Finished, not failed, yet short of --epochs: ASHA stopped it
                # (stop_last_trials=False).
                stopped_early=result.error is None and len(history) < config["epochs"],
                error=None if result.error is None else type(result.error).__name__,
                history=[dict(epoch=h["epoch"], validation_accuracy=h["test_accuracy"])
                         for h in history])


def train_command(config: dict, searched) -> str:
    """The winning flags on the whole training set, full epochs, evaluated on the test set."""
    return command(config, searched, data="cifar10", seed=config["seed"], steps_per_epoch=None)


def noise_command(config: dict, searched) -> str:
    """The winner again on the validation split, at the sweep's budget, with another seed:
    its noise."""
    return command(config, searched, data="cifar10-val", seed=config["seed"] + 1,
                   steps_per_epoch=config["steps_per_epoch"])


def command(config: dict, searched, data: str, seed: int, steps_per_epoch: int | None) -> str:
    """Step 01's baseline script, which trains exactly as step 02's loop does (same global batch,
    same data order), on any machine, with no cluster: the script the README's 10-epoch
    reference was measured with."""
    args = ["python", "01-vanilla-pytorch-ddp/train_single_machine.py", "--data", data,
            "--data-dir", config["data_dir"], "--model", config["model"],
            "--epochs", config["epochs"], "--batch-size", config["batch_size"],
            "--label-smoothing", config["label_smoothing"], "--seed", seed,
            *flags(config, searched).split()]
    if steps_per_epoch:
        args += ["--steps-per-epoch", steps_per_epoch]
    return shlex.join(str(a) for a in args)


def cluster_description() -> str:
    resources = ray.cluster_resources()
    return (f"{len(ray.nodes())} node(s), {resources.get('CPU', 0):.0f} CPUs, "
            f"{resources.get('GPU', 0):.0f} GPUs, Ray {ray.__version__}")


def write_outputs(report: dict, out: Path) -> list:
    """results.md (the table), results.json and validation_accuracy.png in --out; returns the
    printed lines."""
    out.mkdir(parents=True, exist_ok=True)
    best = report["best"]
    lines = [f"`{shlex.join(['python', *sys.argv])}`", "",
             f"Ray cluster: {report['cluster']}; sweep wall time {report['wall_time_s']:.0f} s; "
             f"{time.strftime('%Y-%m-%d')}. Trial 0 trains the flags as given.", "",
             "| trial | searched flags | best validation accuracy | epochs run | stopped early |",
             "|---|---|---|---|---|"]
    for t in report["trials"]:
        accuracy = "-" if t["best_accuracy"] is None else f"{t['best_accuracy']:.2%}"
        stopped = (f"failed ({t['error']})" if t["error"]
                   else "yes (ASHA)" if t["stopped_early"] else "no")
        lines.append(f"| {t['trial_id']} | `{t['searched']}` | {accuracy} | "
                     f"{t['epochs_run']} | {stopped} |")
    lines += ["", f"Best: trial {best['trial_id']}, `{best['searched']}`, "
              f"{best['best_accuracy']:.2%} validation accuracy.", "",
              "Train it on the whole training set (evaluated on the test set):", "",
              f"    {report['train_command']}", "",
              "Its noise: the same flags on the validation split, the sweep's budget, "
              "another seed:", "", f"    {report['noise_command']}"]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    (out / "results.json").write_text(json.dumps(report, indent=1) + "\n")
    plot(report, out / "validation_accuracy.png")
    return lines + ["", f"wrote {out / 'results.md'}, {out / 'results.json'}, "
                        f"{out / 'validation_accuracy.png'}"]


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for t in report["trials"]:
        is_best = t["trial_id"] == report["best"]["trial_id"]
        ax.plot([h["epoch"] for h in t["history"]],
                [h["validation_accuracy"] for h in t["history"]], marker="o",
                linewidth=2.5 if is_best else 1,
                label=f"{t['trial_id']}: {t['searched']}" + (" (best)" * is_best))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="epoch", ylabel="validation accuracy",
           title="Validation accuracy per epoch, every trial")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
