"""Step 05: tune the recipe with Ray Tune; each trial is a Ray Train run of step 02's training loop.

    python 05-ray-tune/tune_ray_ddp.py --num-workers 1 --epochs 3 --steps-per-epoch 100

With Ray Train V2 (Ray 2.60's default) a Tune trial is a plain function that builds a TorchTrainer
with its trial's hyperparameters and calls fit(). Tune no longer takes the Trainer itself: the V1
pattern `Tuner(TorchTrainer(...), param_space={"train_loop_config": ...})` fails at once. A
TuneReportCallback hands every epoch's report to Tune, whose ASHA scheduler stops the trials that
fall behind. The sweep tunes on --data cifar10-val (the last 5,000 training images, held out), never
on the test set, and ends with a table of its trials, a plot of validation accuracy per epoch, the
best flags and the command that trains them.
"""
import importlib.util
import json
import shlex
import sys
import time
from pathlib import Path

import ray
import ray.train
import ray.tune
from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from ray.tune.integration.ray_train import TuneReportCallback
from ray.tune.schedulers import ASHAScheduler
from ray.tune.search import BasicVariantGenerator
from ray.util.placement_group import PlacementGroup

import common
from common import load_data, make_parser
from common.errors import fail
from common.flags import REPOSITORY
from common.ray_setup import WORKER_SETUP, add_ray_flags, check_cluster_and_choose_gpu, init_options
from common.ray_setup import run_name

STEP = "ray_tune"
ROOT = Path(__file__).resolve().parents[1]

# The recipe's three optimisation knobs, searched around the values it uses (2e-3, 1, 0.05).
# Batch size is not searched: with --steps-per-epoch cutting epochs short, a larger batch would
# also see more images per trial.
SEARCH_SPACE = {
    "lr": ray.tune.qloguniform(5e-4, 6e-3, 1e-4),
    "warmup_epochs": ray.tune.quniform(0.25, 1.5, 0.25),
    "weight_decay": ray.tune.qloguniform(0.01, 0.3, 0.005),
}


def search_space(epochs: int) -> dict:
    """SEARCH_SPACE for a sweep of --epochs, its warmup capped at the run: a trial never warms up
    for longer than it trains, and the winner's printed command (same --epochs) passes step 01's
    check that --warmup-epochs is at most --epochs."""
    warmup = SEARCH_SPACE["warmup_epochs"]
    return dict(SEARCH_SPACE, warmup_epochs=ray.tune.quniform(
        warmup.lower, min(warmup.upper, epochs), warmup.sampler.q))
# Tune gives every trial one CPU unless told otherwise. Here a trial only drives its Ray Train run
# (whose controller asks for no CPU either) while the workers train: a CPU held by the trial would
# be one its own workers wait for, forever on a 2-CPU cluster. A trial must ask for something: the
# memory a driver uses.
TRIAL_RESOURCES = {"cpu": 0, "memory": 512 * 2**20}


def load_step02():
    """Step 02's script as a module: the sweep runs its train_func as it is, not a copy. Its folder
    name starts with a digit, so it is loaded from its path; kept out of sys.modules, so that Ray
    pickles its functions by value for the workers (which could not import it by name)."""
    spec = importlib.util.spec_from_file_location("train_ray_ddp",
                                                  ROOT / "02-ray-train-ddp/train_ray_ddp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


train_func = load_step02().train_func


def main():
    parser = add_ray_flags(make_parser(__doc__, STEP))
    parser.set_defaults(data="cifar10-val")
    parser.add_argument("--num-samples", type=int, default=8,
                        help="trials; trial 0 uses the flags as given")
    parser.add_argument("--grace-period", type=int, default=1,
                        help="epochs every trial trains before ASHA may stop it")
    parser.add_argument("--out", default=str(REPOSITORY / "results" / "05-tune"),
                        help="folder for the table (results.md, .json) and plot")
    # --fail-at-epoch crashes a worker of every trial once, --max-failures restarts it
    args = parser.parse_args()
    check_sweep_flags(parser, args)
    load_data(args.data, args.data_dir, args.eval_images)  # fail here, not in the workers (retried)
    name = run_name(STEP, args)  # with --resume, the newest sweep's
    # Not Ray's defaults: init_options (README.md in step 02: Console).
    ray.init(address=args.address, **init_options(args.address),
             runtime_env={"py_modules": [common], **WORKER_SETUP})
    args.use_gpu = check_cluster_and_choose_gpu(args)
    sweep = Path(args.checkpoint_dir, name)
    trainable = ray.tune.with_resources(run_trial, TRIAL_RESOURCES)
    tuner = restore_sweep(sweep, trainable) if args.resume else new_sweep(args, sweep, trainable)
    results = tuner.fit()

    # Tune ends the trials it was running when interrupted (Ctrl-C),
    # after saving them as unfinished.
    if any(t.status not in ("TERMINATED", "ERROR")
           for t in ray.tune.ExperimentAnalysis(str(sweep)).trials):
        raise fail(f"sweep {name} was interrupted; run the same command with --resume to finish it")
    trials = sorted((describe_trial(result, sweep) for result in results),
                    key=lambda t: t["trial_id"])
    if not any(t["history"] for t in trials):
        raise fail(f"no trial of sweep {name} finished an epoch; see the errors above")
    best = max((t for t in trials if t["history"]), key=lambda t: t["best_accuracy"])
    report = dict(step=STEP, sweep=str(sweep), cluster=cluster_description(), trials=trials,
                  best=best, train_command=train_command(best["config"]),
                  noise_command=noise_command(best["config"]),
                  wall_time_s=time.time() - args.launched)
    ray.shutdown()  # no more Ray output: the JSON below stays the last line
    print("\n".join(write_outputs(report, Path(args.out))))
    failed = sum(t["error"] is not None for t in trials)
    if failed:
        raise fail(f"{failed} trial(s) failed (see above); run the same command with --resume to "
                   f"continue them from their last checkpoint")
    print(json.dumps(report))


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


def new_sweep(args, sweep: Path, trainable) -> ray.tune.Tuner:
    """--num-samples trials, as many at once as the cluster holds, stopped early by ASHA."""
    at_once = trials_at_once(args)
    print(f"sweep {sweep.name}: {args.num_samples} trials of {args.num_workers} worker(s), "
          f"{at_once} at a time; ASHA on validation accuracy from epoch {args.grace_period} of "
          f"{args.epochs}. Interrupted? Run the same command with --resume", flush=True)
    # Trial 0 trains the flags as given (the recipe, by default): the sweep measures its
    # winner against it.
    # max_concurrent: Ray Train starts a run only when all its workers fit, so more trials at once
    # would only wait. (TuneConfig(max_concurrent_trials) would do the same for Tune's default
    # search, and wraps a Searcher, Optuna's or HyperOpt's, in a ConcurrencyLimiter; but Tune
    # ignores it, with a mere warning, when given a BasicVariantGenerator, as here.)
    recipe = {key: getattr(args, key) for key in SEARCH_SPACE}
    search = BasicVariantGenerator(
        points_to_evaluate=[recipe], max_concurrent=at_once,
        random_state=args.seed)
    # After grace_period, 2 x grace_period, ... epochs, a trial below the median of the trials
    # that got there stops. A trial at its last epoch ends by itself (stop_last_trials=False):
    # its Ray Train run completes.
    asha = ASHAScheduler(
        time_attr="epoch", max_t=args.epochs,
        grace_period=args.grace_period, reduction_factor=2,
        stop_last_trials=False)
    return ray.tune.Tuner(
        trainable,
        # A trial's config is step 02's config: every flag, with this trial's values of the
        # searched ones. Tune saves it with the sweep, so a resumed trial trains with the flags
        # it started with.
        param_space=dict(vars(args), **search_space(args.epochs)),
        tune_config=ray.tune.TuneConfig(
            # Step 02's name for the metric; on cifar10-val it is validation accuracy.
            metric="test_accuracy", mode="max",
            num_samples=args.num_samples, search_alg=search, scheduler=asha),
        run_config=ray.tune.RunConfig(
            name=sweep.name, storage_path=str(sweep.parent), verbose=0,
            callbacks=[PrintTrialProgress(), FreeStoppedTrialsWorkers(sweep)]))


def trials_at_once(args) -> int:
    resources = ray.cluster_resources()
    return int(resources.get("GPU" if args.use_gpu else "CPU", 0)) // args.num_workers


def restore_sweep(path: Path, trainable) -> ray.tune.Tuner:
    """Tune restores the search, the scheduler, its callbacks and every trial's config. An
    unfinished or failed trial starts its Ray Train run again under the same name, and Ray Train
    resumes it from its checkpoint."""
    if not ray.tune.Tuner.can_restore(str(path)):
        raise fail(f"--resume but {path} holds no Tune state to resume; run without --resume")
    print(f"resuming sweep {path.name}; its trials keep the flags they started with", flush=True)
    return ray.tune.Tuner.restore(
        str(path), trainable=trainable, resume_errored=True)


def run_trial(config):
    """One trial, in a Tune actor: a Ray Train run of step 02's train_func
    with this trial's config."""
    context = ray.tune.get_context()
    # Named after the trial, not a timestamp: a restarted trial finds its own run,
    # and Ray Train resumes it.
    run = Path(config["checkpoint_dir"], context.get_experiment_name(),
               f"train-{context.get_trial_id()}")
    trial_group = ray.util.get_current_placement_group().id.hex()
    trainer = TorchTrainer(
        train_noting_placement_groups,
        # checkpoint_dir: where step 02's train finds this run's folder (--profile-steps' traces)
        train_loop_config=dict(config, launched=time.time(), run_dir=str(run),
                               checkpoint_dir=str(run.parent), trial_placement_group=trial_group),
        scaling_config=ScalingConfig(num_workers=config["num_workers"], use_gpu=config["use_gpu"]),
        run_config=RunConfig(
            name=run.name, storage_path=str(run.parent),
            # Worker restarts within the trial, from its last checkpoint:
            failure_config=FailureConfig(max_failures=config["max_failures"]),
            logging_config=LoggingConfig(log_level="WARNING"),
            # The latest only: what a restart resumes from.
            checkpoint_config=CheckpointConfig(num_to_keep=1),
            # Every ray.train.report also reaches Tune (and ASHA):
            callbacks=[TuneReportCallback()]))
    trainer.fit()


def train_noting_placement_groups(config):
    """Runs in every worker: step 02's train_func, once rank 0 has noted the placement groups of its
    trial and of its run's workers, for FreeStoppedTrialsWorkers."""
    if ray.train.get_context().get_world_rank() == 0:
        workers = ray.util.get_current_placement_group().id.hex()
        Path(config["run_dir"], "placement_groups").write_text(
            f"{config['trial_placement_group']} {workers}")
    train_func(config)


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

    def on_trial_result(self, iteration, trials, trial, result, **info):
        print(f"trial {trial.trial_id} ({flags(trial.config)}): "
              f"epoch {result['epoch']}/{trial.config['epochs']}, "
              f"validation accuracy {result['test_accuracy']:.2%}", flush=True)

    def on_trial_complete(self, iteration, trials, trial, **info):
        epochs = trial.last_result.get("epoch", 0)
        print(f"trial {trial.trial_id}: " + ("done" if epochs == trial.config["epochs"] else
                                             f"stopped by ASHA after epoch {epochs}"), flush=True)

    def on_trial_error(self, iteration, trials, trial, **info):
        print(f"trial {trial.trial_id}: failed, see {trial.error_file}", flush=True)


def flags(config: dict) -> str:
    return " ".join(f"--{key.replace('_', '-')} {config[key]:g}" for key in SEARCH_SPACE)


def describe_trial(result, sweep: Path) -> dict:
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
                searched=flags(config), config=config,
                best_accuracy=max((h["test_accuracy"] for h in history), default=None),
                epochs_run=len(history),
                # Finished, not failed, yet short of --epochs: ASHA stopped it
                # (stop_last_trials=False).
                stopped_early=result.error is None and len(history) < config["epochs"],
                error=None if result.error is None else type(result.error).__name__,
                history=[dict(epoch=h["epoch"], validation_accuracy=h["test_accuracy"])
                         for h in history])


def train_command(config: dict) -> str:
    """The winning flags on the whole training set, full epochs, evaluated on the test set."""
    return command(config, data="cifar10", seed=config["seed"], steps_per_epoch=None)


def noise_command(config: dict) -> str:
    """The winner again on the validation split, at the sweep's budget, with another seed:
    its noise."""
    return command(config, data="cifar10-val", seed=config["seed"] + 1,
                   steps_per_epoch=config["steps_per_epoch"])


def command(config: dict, data: str, seed: int, steps_per_epoch: int | None) -> str:
    """Step 01's baseline script, which trains exactly as step 02's loop does (same global batch,
    same data order), on any machine, with no cluster: the script the README's 10-epoch
    reference was measured with."""
    args = ["python", "01-vanilla-pytorch-ddp/train_single_machine.py", "--data", data,
            "--data-dir", config["data_dir"], "--model", config["model"],
            "--epochs", config["epochs"], "--batch-size", config["batch_size"],
            "--label-smoothing", config["label_smoothing"], "--seed", seed,
            *flags(config).split()]
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


if __name__ == "__main__":
    main()
