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

import common
from common.data import load_data
from common.errors import fail
from common.flags import REPOSITORY, add_ray_flags, make_parser
from common.ray_setup import check_cluster_and_choose_gpu, init_options, worker_setup
from common.runs import run_name
# What the sweep needs beyond the lesson: a workaround, its console lines, its table and plot.
from common.sweep import FreeStoppedTrialsWorkers, PrintTrialProgress, check_sweep_flags
from common.sweep import cluster_description, describe_trial, noise_command, note_placement_groups
from common.sweep import train_command, write_outputs

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
             runtime_env={"py_modules": common.__path__, **worker_setup()})
    use_gpu = check_cluster_and_choose_gpu(args)
    sweep = Path(args.checkpoint_dir, name)
    trainable = ray.tune.with_resources(run_trial, TRIAL_RESOURCES)
    if args.resume:
        tuner = restore_sweep(sweep, trainable)
    else:
        tuner = new_sweep(args, use_gpu, sweep, trainable)
    results = tuner.fit()

    # Tune ends the trials it was running when interrupted (Ctrl-C),
    # after saving them as unfinished.
    if any(t.status not in ("TERMINATED", "ERROR")
           for t in ray.tune.ExperimentAnalysis(str(sweep)).trials):
        raise fail(f"sweep {name} was interrupted; run the same command with --resume to finish it")
    trials = sorted((describe_trial(result, sweep, SEARCH_SPACE) for result in results),
                    key=lambda t: t["trial_id"])
    if not any(t["history"] for t in trials):
        raise fail(f"no trial of sweep {name} finished an epoch; see the errors above")
    best = max((t for t in trials if t["history"]), key=lambda t: t["best_accuracy"])
    report = dict(step=STEP, sweep=str(sweep), cluster=cluster_description(), trials=trials,
                  best=best, train_command=train_command(best["config"], SEARCH_SPACE),
                  noise_command=noise_command(best["config"], SEARCH_SPACE),
                  wall_time_s=time.time() - args.launched)
    ray.shutdown()  # no more Ray output: the JSON below stays the last line
    print("\n".join(write_outputs(report, Path(args.out))))
    failed = sum(t["error"] is not None for t in trials)
    if failed:
        raise fail(f"{failed} trial(s) failed (see above); run the same command with --resume to "
                   f"continue them from their last checkpoint")
    # The last line: the headline, and where the whole report is (results.json, in --out).
    print(json.dumps(dict(step=STEP, trials=len(trials), best_trial=best["trial_id"],
                          best_accuracy=round(best["best_accuracy"], 4),
                          wall_time_s=round(report["wall_time_s"], 1),
                          summary=str((Path(args.out) / "results.json").resolve()))))


def new_sweep(args, use_gpu: bool, sweep: Path, trainable) -> ray.tune.Tuner:
    """--num-samples trials, as many at once as the cluster holds, stopped early by ASHA."""
    at_once = trials_at_once(args.num_workers, use_gpu)
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
    # that got there stops. One that reports its last epoch has trained it all, whatever ASHA
    # decides then (a rung at max_t may stop it after that report): the table counts it finished.
    asha = ASHAScheduler(
        time_attr="epoch", max_t=args.epochs,
        grace_period=args.grace_period, reduction_factor=2,
        stop_last_trials=False)
    return ray.tune.Tuner(
        trainable,
        # A trial's config is step 02's config: every flag, with this trial's values of the
        # searched ones. Tune saves it with the sweep, so a resumed trial trains with the flags
        # it started with.
        param_space=dict(vars(args), use_gpu=use_gpu,
                         **search_space(args.epochs)),
        tune_config=ray.tune.TuneConfig(
            metric="test_accuracy", mode="max",  # step 02's name, here on the validation split
            num_samples=args.num_samples, search_alg=search, scheduler=asha),
        run_config=ray.tune.RunConfig(
            name=sweep.name, storage_path=str(sweep.parent), verbose=0,
            callbacks=[PrintTrialProgress(SEARCH_SPACE), FreeStoppedTrialsWorkers(sweep)]))


def trials_at_once(num_workers: int, use_gpu: bool) -> int:
    resources = ray.cluster_resources()
    return int(resources.get("GPU" if use_gpu else "CPU", 0)) // num_workers


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
    trial and of its run's workers (common/sweep.py: FreeStoppedTrialsWorkers)."""
    note_placement_groups(config)
    train_func(config)


if __name__ == "__main__":
    main()
