"""Lab 05's checks: SEARCH_SPACE as written, then, if it passes, the lab's sweep() of 3 trials of 2 epochs, 1 worker
each. In every process of Ray's job, load_data records the data a trial asks for and hands out synthetic images
instead, each split's its own, and evaluate records the images it scores (labs.watch); in this process, where Tune's
controller runs, the ASHA scheduler's every decision is recorded, with the rung it compared the trial at and the
cutoff it drew there from the trials before it. As each trial ends, the trials so far are judged: where they already
fail a check that no trial after them can pass, or the first ended with no decision of ASHA's, the sweep stops, and
the checks after its first failure are not run (a wrong answer's check then takes one or two trials, not three)."""
import statistics
import tempfile
from collections import Counter
from dataclasses import dataclass

from ray.tune.schedulers import AsyncHyperBandScheduler, FIFOScheduler, TrialScheduler
from ray.tune.search.sample import Domain, LogUniform

from common.data import load_data
from labs import watch
from labs.harness import lab_args, load_lab
from labs.outcome import Outcome, crashed
from labs.ray_runs import ray_error, start_ray

VALIDATION = "every trial trains on cifar10-val and is scored on the images it holds out, not the test set's"
SEARCHED = "lr and weight_decay are searched on a log scale around the recipe's, and every trial tries other values"
SEEN = "Tune sees every epoch each trial's Ray Train run reports"
COMPARED = "after their first epoch, ASHA stops the trials below the median test_accuracy of those before them"
TRAINED = "a trial ASHA keeps trains to the run's last epoch, ASHA's max_t"
BEST = "the best result Tuner.fit() returns is the trial that scored best"
CHECKS = [VALIDATION, SEARCHED, SEEN, COMPARED, TRAINED, BEST]
TRIALS = 3
# Long enough that the first epoch's accuracy tells the trials apart: after 4 steps they all sit near chance. Scored on
# 255 held-out images, not the other labs' 63: ASHA compares the trials by accuracy, and a tie at a rung would let a
# scheduler that minimises decide as one that maximises.
LONGER_EPOCHS = ["--steps-per-epoch", "8", "--eval-images", "255"]
RECIPE = {"lr": 2e-3, "weight_decay": 0.05}  # the steps' defaults (common/flags.py)
METRIC = "test_accuracy"  # what train_func reports: on cifar10-val, the validation accuracy


def run(lab_file, address) -> list:
    lab, args = load_lab(lab_file), lab_args(*LONGER_EPOCHS, "--data", "cifar10")  # the steps' default: test set
    args.num_samples = TRIALS
    space = search_space(getattr(lab, "SEARCH_SPACE", {}))
    if not space.passed:  # as a sweep should be: its search space checked before any trial spends a CPU on it
        not_run = "not run: no sweep over a SEARCH_SPACE that fails its check"
        return [space if check == SEARCHED else Outcome(check, not_run, "") for check in CHECKS]
    # A trial that reports nothing to Tune ends as done, not as an error: the check then says what Tune saw.
    with tempfile.TemporaryDirectory() as storage, \
            recording_decisions(args.epochs, lambda decisions: decided(storage, decisions, args)) as decisions:
        # A CPU for each trial: a trial that Tune stops while its run is still on keeps its worker's CPU
        # reserved till the sweep ends (Ray 2.60 without the dashboard: 05-ray-tune/README.md, "What Ray does not
        # do for you"), and the last trial must still find one, whichever trials ASHA stopped, and when.
        start_ray(address, watch.environment(storage, ["load_data", "evaluate"]), cpus=TRIALS,
                  TUNE_DISABLE_STRICT_METRIC_CHECKING="1")
        args.checkpoint_dir = storage
        try:
            grid = lab.sweep(args, storage)
        except Exception as error:
            return crashed(CHECKS, ray_error(error))
        results = list(grid)
        errors = [result.error for result in results if result.error]
        if errors:
            return crashed(CHECKS, f"{len(errors)} trial(s) failed: {ray_error(errors[0])}")
        outcomes = [validation(watch.read(storage), args), searched([result.config for result in results]),
                    seen(results), compared(decisions), trained(decisions, args.epochs), best(grid, results)]
        return outcomes if not decisions.stopped else stopped_at_first_failure(outcomes)


STOPPED = "not run: the sweep stopped at the failure above"


def decided(storage: str, decisions: list, args) -> bool:
    """Whether the trials that have ended fail a check that no trial after them can pass: images scored or data asked
    for that are not the validation split's, a first epoch that ASHA misjudged or did not compare at, another max_t."""
    try:
        calls = watch.read(storage)
    except ValueError:  # a record still being written: judged at the next trial's end
        calls = []
    scored = any(call["function"] == "evaluate" for call in calls)
    outcomes = [validation(calls, args) if scored else None, compared(decisions),
                trained(decisions, args.epochs) if decisions[0].max_t != args.epochs else None]
    return any(outcome and not outcome.passed for outcome in outcomes)


def stopped_at_first_failure(outcomes: list) -> list:
    """A sweep stopped early leaves the checks after its first failure to the trials it did not run."""
    first = next(i for i, outcome in enumerate(outcomes) if not outcome.passed)
    return [*outcomes[:first + 1], *(Outcome(check, STOPPED, "") for check in CHECKS[first + 1:])]


@dataclass
class Decision:
    """One of ASHA's decisions, on a trial's report: the rung (an epoch) at which ASHA compared it with the trials
    recorded there before it, and the cutoff it drew from their metrics (None where it compared at no rung)."""
    trial: str  # "trial 0": Tune's order, trial 0 trains the flags as given
    epoch: int  # as the trial reported it (ASHA's time_attr may be another name for it)
    metric: float  # the trial's test_accuracy
    action: str  # TrialScheduler.CONTINUE or STOP
    rung: float | None
    cutoff: float | None
    max_t: float


class Decisions(list):
    """ASHA's decisions, and whether the sweep was stopped before its trials ended."""
    stopped = False

    def stop(self, tune_controller) -> None:
        """Stops the sweep, once: Tune stops its trials and starts no other."""
        if not self.stopped:
            self.stopped = True
            tune_controller.request_stop_experiment()


class recording_decisions:
    """ASHA's decisions while the sweep runs: its on_trial_result replaced in its class, so whichever ASHA the lab
    makes records them. As a trial ends (stopped, or at the run's last epoch), the experiment is stopped if
    failed(the decisions so far); and as the first trial ends with no decision of ASHA's (Tune saw none of its
    reports, or handed them to no ASHA; told by the on_trial_complete of Tune's default FIFOScheduler and of ASHA,
    replaced too): the trials after it report through the same callbacks to the same scheduler."""

    def __init__(self, epochs: int, failed):
        self.epochs, self.failed = epochs, failed

    def __enter__(self) -> Decisions:
        decisions, self.decide = Decisions(), AsyncHyperBandScheduler.on_trial_result

        def recorded(scheduler, tune_controller, trial, result):
            bracket = scheduler._trial_info[trial.trial_id]
            before = {milestone: dict(rung) for milestone, rung in bracket._rungs}
            action = self.decide(scheduler, tune_controller, trial, result)
            decisions.append(decision(scheduler, bracket, before, trial.trial_id, result, action))
            ended = action == TrialScheduler.STOP or decisions[-1].epoch == self.epochs
            if ended and not decisions.stopped and self.failed(decisions):
                decisions.stop(tune_controller)
            return action

        def completed(complete):
            def undecided_stops(scheduler, tune_controller, trial, result):
                complete(scheduler, tune_controller, trial, result)
                if not decisions:  # compared() then fails: no ASHA saw a result
                    decisions.stop(tune_controller)
            return undecided_stops

        self.completes = {scheduler: scheduler.on_trial_complete for scheduler in COMPLETED}
        for scheduler, complete in self.completes.items():
            scheduler.on_trial_complete = completed(complete)
        AsyncHyperBandScheduler.on_trial_result = recorded
        return decisions

    def __exit__(self, *exception):
        AsyncHyperBandScheduler.on_trial_result = self.decide
        for scheduler, complete in self.completes.items():
            scheduler.on_trial_complete = complete


# The schedulers whose on_trial_complete tells a trial that ended with no ASHA decision: Tune's default, and ASHA
COMPLETED = (FIFOScheduler, AsyncHyperBandScheduler)


def decision(scheduler, bracket, before: dict, trial_id: str, result: dict, action: str) -> Decision:
    """A decision as the bracket's rungs show it: the rung that recorded this trial's result (before: each rung's
    records before it), in the metric's own sign (ASHA records its negative when it minimises)."""
    rung = next((milestone for milestone, recorded in bracket._rungs
                 if trial_id in recorded and trial_id not in before[milestone]), None)
    cutoff = bracket.cutoff(before.get(rung, {}))
    return Decision(trial_name(trial_id), result.get("epoch"), result.get(METRIC), action, rung,
                    None if cutoff is None else scheduler._metric_op * float(cutoff), scheduler._max_t)


def trial_name(trial_id: str) -> str:
    """Tune numbers its trials in the order it makes them (<experiment>_00000, ...)."""
    return f"trial {int(trial_id.rsplit('_', 1)[-1])}"


VALIDATION_HINT = ("a sweep keeps the trial that scores best: scored on the test set, it fits the test set, which "
                   "then measures nothing; scored on images it trains on, it rewards memorising them. Score on the "
                   "images cifar10-val holds out, which load_data hands out as its test_images")


def validation(calls: list[dict], args):
    """The images every evaluate call scored, told apart by the split the watched load_data hands them out in."""
    held_out = watch.stand_in(load_data, "cifar10-val", args.data_dir, args.eval_images)
    expected = sorted(watch.image_digests(held_out.test_images))
    asked = sorted({call["data"] for call in calls if call["function"] == "load_data"})
    scored = [call["images"] for call in calls if call["function"] == "evaluate"]
    wrong = next((images for images in scored if sorted(images) != expected), None)
    failure = None
    if not scored:
        failure = f"no trial scored any images with evaluate (they asked load_data for {asked})"
    elif wrong is not None:
        failure = (f"a trial scored {len(wrong)} images: {where_from(wrong, held_out, args)} (cifar10-val holds "
                   f"out {len(expected)}); they asked load_data for {asked}")
    elif asked != ["cifar10-val"]:
        failure = f"the trials asked load_data for {asked}"
    return Outcome(VALIDATION, failure, VALIDATION_HINT)


def where_from(images: list[str], held_out, args) -> str:
    """How many of these images (digests) each split holds, as the watched load_data hands them out."""
    splits = {**dict.fromkeys(watch.image_digests(load_data("synthetic", args.data_dir).test_images), "the test set"),
              **dict.fromkeys(watch.image_digests(held_out.train_images), "cifar10-val's training images"),
              **dict.fromkeys(watch.image_digests(held_out.test_images), "the images cifar10-val holds out")}
    counts = Counter(splits.get(image, "no split's images") for image in images)
    return ", ".join(f"{count} from {split}" for split, count in counts.most_common())


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


def seen(results: list):
    last = [(result.metrics or {}).get("epoch", 0) for result in results]
    failure = None
    if not any(last):
        failure = "Tune saw no result of any trial"
    return Outcome(SEEN, failure, "Tune sees a Ray Train run's reports only through a callback of the run")


NO_ASHA = "no ASHA scheduler saw a result"
NO_ASHA_HINT = ("Tune hands every result it sees (a trial's Ray Train run reports through its callback) to the "
                "scheduler its TuneConfig is given")
RUNGS_HINT = ("ASHA compares a trial with the others at its rungs: the first after grace_period epochs, then every "
              "reduction_factor times as many, up to max_t")
MEDIAN_HINT = ("ASHA stops a trial whose metric is below the median of the trials that reached the rung before it; "
               "which way is better is the mode: test_accuracy is maximised (mode=\"max\")")
CUTOFF_HINT = ("ASHA's cutoff at a rung is the (1 - 1/reduction_factor) quantile of the trials there: "
               "reduction_factor=2 makes it their median, and keeps the better half")


def compared(decisions: list[Decision]):
    """ASHA's decision on each trial's first epoch against the check's own: stopped if below the median of the first
    epochs of the trials before it (the first trial goes on), with the median as ASHA's cutoff."""
    if not decisions:
        return Outcome(COMPARED, NO_ASHA, NO_ASHA_HINT)
    if 1 not in rungs(decisions):
        return Outcome(COMPARED, f"ASHA compared the trials {compared_at(decisions)}, not after their first epoch",
                       RUNGS_HINT)
    before = []
    for d in first_epochs(decisions):
        if failure := misjudged(d, before):
            return failure
        before.append(d.metric)
    return Outcome(COMPARED, None, MEDIAN_HINT)


def misjudged(d: Decision, before: list[float]) -> Outcome | None:
    """ASHA's decision on a trial's first epoch, where it is not the median's of the first epochs before it."""
    if not before:
        return None if d.action == TrialScheduler.CONTINUE else Outcome(
            COMPARED, f"after epoch 1 ASHA stopped {d.trial} ({d.metric:.3f}), the first to get there", MEDIAN_HINT)
    median = statistics.median(before)
    there = f"the median {median:.3f} of the trials before it, {rounded(before)}"
    if d.action == TrialScheduler.STOP and d.metric >= median:
        return Outcome(COMPARED, f"after epoch 1 ASHA stopped {d.trial} ({d.metric:.3f}), not below {there}",
                       MEDIAN_HINT)
    if d.action == TrialScheduler.CONTINUE and d.metric < median:
        return Outcome(COMPARED, f"after epoch 1 ASHA let {d.trial} ({d.metric:.3f}) go on, below {there}",
                       MEDIAN_HINT)
    if abs(d.cutoff - median) > 1e-9:
        return Outcome(COMPARED, f"after epoch 1 ASHA compared {d.trial} ({d.metric:.3f}) with a cutoff of "
                                 f"{d.cutoff:.3f}, not {there}", CUTOFF_HINT)
    return None


def rungs(decisions: list[Decision]) -> list[float]:
    """The epochs at which ASHA compared a trial with those recorded there before it."""
    return sorted({d.rung for d in decisions if d.rung is not None})


def compared_at(decisions: list[Decision]) -> str:
    epochs = rungs(decisions)
    return f"after epoch(s) {', '.join(f'{epoch:g}' for epoch in epochs)} only" if epochs else "at no rung"


def first_epochs(decisions: list[Decision]) -> list[Decision]:
    """Each trial's decision on its first epoch, in the order ASHA made them."""
    firsts = {}
    for d in decisions:
        if d.epoch == 1:
            firsts.setdefault(d.trial, d)
    return list(firsts.values())


def rounded(values: list[float]) -> str:
    return f"[{', '.join(f'{value:.3f}' for value in values)}]"


TRAINED_HINT = ("max_t is where ASHA ends the trials it keeps and its last rung: the run's epochs, so that a trial "
                "that beats the others trains to the end")


def trained(decisions: list[Decision], epochs: int):
    """The trials ASHA kept after their first epoch, and the last epoch each trained before Tune stopped it (a
    report that arrives after Tune's stop trained nothing more for the sweep)."""
    if not decisions:
        return Outcome(TRAINED, NO_ASHA, NO_ASHA_HINT)
    kept = [d.trial for d in first_epochs(decisions) if d.action == TrialScheduler.CONTINUE]
    reached = {trial: last_epoch(decisions, trial) for trial in kept}
    failure = None
    if decisions[0].max_t != epochs:
        failure = (f"ASHA's max_t is {decisions[0].max_t:g}, not the run's {epochs} epochs: it compared the trials "
                   f"{compared_at(decisions)}")
    elif not any(epoch == epochs for epoch in reached.values()):
        failure = f"no trial ASHA kept after epoch 1 trained to epoch {epochs}: " + (
            ", ".join(f"{trial} to epoch {epoch}" for trial, epoch in reached.items()) or "it kept none")
    return Outcome(TRAINED, failure, TRAINED_HINT)


def last_epoch(decisions: list[Decision], trial: str) -> int:
    """The last epoch of a trial that ASHA decided on, up to the first it stopped the trial at."""
    own = [d for d in decisions if d.trial == trial]
    stop = next((i for i, d in enumerate(own) if d.action == TrialScheduler.STOP), len(own))
    return max(d.epoch for d in own[:stop + 1])


BEST_HINT = ("Tune ranks the trials' results by TuneConfig's metric and mode: test_accuracy, maximised; "
             "Tuner.fit()'s get_best_result() is then the best trial's")


def best(grid, results: list):
    """The result get_best_result() names against the trial whose last test_accuracy is the highest."""
    try:
        chosen = trial_name(grid.get_best_result().metrics["trial_id"])
    except (ValueError, RuntimeError) as error:
        return Outcome(BEST, f"Tuner.fit()'s results name no best: {str(error).split('. ')[0]}", BEST_HINT)
    scores = {trial_name(result.metrics["trial_id"]): result.metrics[METRIC] for result in results
              if METRIC in (result.metrics or {})}
    if chosen not in scores:  # a trial Tune saw no result of (a sweep stopped early may return one)
        return Outcome(BEST, f"Tuner.fit() returns {chosen} as the best, which reported no {METRIC}", BEST_HINT)
    top = max(scores, key=scores.get)
    failure = None
    if chosen != top:
        failure = f"Tuner.fit() returns {chosen} ({scores[chosen]:.3f}) as the best; {top} scored {scores[top]:.3f}"
    return Outcome(BEST, failure, BEST_HINT)
