"""Lab 05's checks: SEARCH_SPACE as written, then, if it passes, the lab's sweep() of 3 trials of 2 epochs, 1 worker
each. In every process of Ray's job, load_data records the data a trial asks for and hands out the synthetic images
instead (labs.watch); in this process, where Tune's controller runs, the ASHA scheduler's every decision is
recorded."""
import tempfile

from ray.tune.schedulers import AsyncHyperBandScheduler, TrialScheduler
from ray.tune.search.sample import Domain, LogUniform

from labs import watch
from labs.harness import Outcome, crashed, lab_args, load_lab, ray_error, start_ray

VALIDATION = "every trial trains and is scored on the validation split, not the test set"
SEARCHED = "lr and weight_decay are searched on a log scale around the recipe's, and every trial tries other values"
SEEN = "Tune sees every epoch each trial's Ray Train run reports"
COMPARED = "ASHA compares the trials after their first epoch: it stops one below the others, another trains to the end"
CHECKS = [VALIDATION, SEARCHED, SEEN, COMPARED]
TRIALS = 3
# Long enough that the first epoch's accuracy tells the trials apart: after 4 steps they all sit near chance.
LONGER_EPOCHS = ["--steps-per-epoch", "8"]
RECIPE = {"lr": 2e-3, "weight_decay": 0.05}  # the steps' defaults (common/flags.py)


def run(lab_file, address) -> list:
    lab, args = load_lab(lab_file), lab_args(*LONGER_EPOCHS, "--data", "cifar10")  # the steps' default: test set
    args.num_samples = TRIALS
    space = search_space(getattr(lab, "SEARCH_SPACE", {}))
    if not space.passed:  # as a sweep should be: its search space checked before any trial spends a CPU on it
        not_run = "not run: no sweep over a SEARCH_SPACE that fails its check"
        return [space if check == SEARCHED else Outcome(check, not_run, "") for check in CHECKS]
    # A trial that reports nothing to Tune ends as done, not as an error: the check then says what Tune saw.
    with tempfile.TemporaryDirectory() as storage, recording_decisions() as decisions:
        start_ray(address, watch.environment(storage, ["load_data"]), TUNE_DISABLE_STRICT_METRIC_CHECKING="1")
        args.checkpoint_dir = storage
        try:
            results = list(lab.sweep(args, storage))
        except Exception as error:
            return crashed(CHECKS, ray_error(error))
        splits = sorted({call["data"] for call in watch.read(storage)})
    errors = [result.error for result in results if result.error]
    if errors:
        return crashed(CHECKS, f"{len(errors)} trial(s) failed: {ray_error(errors[0])}")
    return [validation(splits), searched([result.config for result in results]),
            seen(results, args.epochs), compared(decisions, args.epochs)]


class recording_decisions:
    """ASHA's decisions, (trial id, epoch, decision, the metric it decided on), while the sweep runs: its
    on_trial_result replaced in its class, so whichever ASHA the lab makes records them."""

    def __enter__(self) -> list:
        decisions, self.decide = [], AsyncHyperBandScheduler.on_trial_result

        def recorded(scheduler, tune_controller, trial, result):
            decision = self.decide(scheduler, tune_controller, trial, result)
            decisions.append((trial.trial_id, result.get(scheduler._time_attr), decision,
                              result.get(scheduler._metric)))
            return decision

        AsyncHyperBandScheduler.on_trial_result = recorded
        return decisions

    def __exit__(self, *exception):
        AsyncHyperBandScheduler.on_trial_result = self.decide


def validation(splits: list[str]):
    failure = None
    if splits != ["cifar10-val"]:
        failure = f"the trials asked load_data for {splits}" + (" (scored on the test set)" if "cifar10" in splits
                                                                 else "")
    return Outcome(VALIDATION, failure, "a sweep that picks the best test accuracy has fit the test set, which "
                                        "then measures nothing: tune on the held-out cifar10-val")


SEARCHED_HINT = ("a learning rate or a weight decay acts by its order of magnitude: sample it log-uniformly "
                 "(ray.tune.loguniform, qloguniform) over a range that holds the recipe's value")


def search_space(space: dict):
    """The search space as written: a log-scale distribution of each knob, around the recipe's value."""
    for key, value in RECIPE.items():
        domain = space.get(key)
        if not isinstance(domain, Domain):
            return Outcome(SEARCHED, f"SEARCH_SPACE has no Tune distribution for {key}: {domain!r}", SEARCHED_HINT)
        sampler = domain.get_sampler()
        if not isinstance(getattr(sampler, "sampler", sampler), LogUniform):
            return Outcome(SEARCHED, f"{key} is sampled by {type(sampler).__name__.lstrip('_')}, not on a log "
                                     "scale", SEARCHED_HINT)
        if not domain.lower < value < domain.upper:
            return Outcome(SEARCHED, f"{key}'s range [{domain.lower:g}, {domain.upper:g}] leaves out the recipe's "
                                     f"{value:g}", SEARCHED_HINT)
    return Outcome(SEARCHED, None, SEARCHED_HINT)


def searched(configs: list[dict]):
    """The values the sweep's trials tried, once the search space passed: a new one each trial."""
    for key in RECIPE:
        if len({config[key] for config in configs}) != len(configs):
            return Outcome(SEARCHED, f"the {len(configs)} trials tried {key} = "
                                     f"{[config[key] for config in configs]}", SEARCHED_HINT)
    return Outcome(SEARCHED, None, SEARCHED_HINT)


def seen(results: list, epochs: int):
    last = [(result.metrics or {}).get("epoch", 0) for result in results]
    failure = None
    if not any(last):
        failure = f"Tune saw no result of any of the {len(results)} trials"
    return Outcome(SEEN, failure, "Tune sees a Ray Train run's reports only through a callback of the run")


def compared(decisions: list, epochs: int):
    stopped = {trial for trial, epoch, decision, _ in decisions if decision == TrialScheduler.STOP and epoch < epochs}
    finished = {trial for trial, epoch, _, _ in decisions if epoch == epochs}
    failure = None
    if not decisions:
        failure = "no ASHA scheduler saw a result"
    elif not stopped:
        failure = f"ASHA stopped no trial before epoch {epochs}"
    elif not finished:
        failure = f"ASHA stopped every trial ({len(stopped)}) before epoch {epochs}"
    return Outcome(COMPARED, failure, "ASHA compares each trial at its rungs (grace_period, then times "
                                      "reduction_factor) with the trials that got there, until max_t, the run's end")
