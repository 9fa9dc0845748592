"""Lab 05's checks: the lab's sweep() of 3 trials of 2 epochs, 1 worker each. The trials' load_data records the
split each asks for into a file of the check's folder, and hands out the synthetic images instead."""
import tempfile
from pathlib import Path

from common import load_data
from labs.harness import Outcome, crashed, lab_args, load_lab, start_ray

VALIDATION = "every trial trains and is scored on the validation split, not the test set"
STOPPED = "ASHA stops a trial that scores below the median after its first epoch"
TRIALS = 3
# Long enough that the first epoch's accuracy tells the trials apart: after 4 steps they all sit near chance.
LONGER_EPOCHS = ["--steps-per-epoch", "8"]


class RecordingSplits:
    """load_data, writing the name of the data each call asks for into a file, and loading the synthetic data."""

    def __init__(self, log: Path):
        self.log = log

    def __call__(self, name: str, data_dir: str, eval_images: int | None = None):
        with open(self.log, "a") as log:
            log.write(f"{name}\n")
        return load_data("synthetic", data_dir, eval_images)


def run(lab_file, address) -> list:
    lab, args = load_lab(lab_file), lab_args(*LONGER_EPOCHS, "--data", "cifar10")  # the steps' default: test set
    args.num_samples = TRIALS
    # A trial that reports nothing to Tune ends as done, not as an error: the check then says what Tune saw.
    start_ray(address, TUNE_DISABLE_STRICT_METRIC_CHECKING="1")
    with tempfile.TemporaryDirectory() as storage:
        log = Path(storage) / "splits"
        log.touch()
        lab.load_data = RecordingSplits(log)
        args.checkpoint_dir = storage
        results = list(lab.sweep(args, storage))
        splits = sorted(set(log.read_text().split()))
    errors = [result.error for result in results if result.error]
    if errors:
        return crashed([VALIDATION, STOPPED], f"{len(errors)} trial(s) failed: {errors[0]}")
    epochs = [(result.metrics or {}).get("epoch", 0) for result in results]
    return [validation(splits), stopped(epochs, args.epochs)]


def validation(splits: list[str]):
    failure = None
    if splits != ["cifar10-val"]:
        failure = f"the trials asked load_data for {splits}" + (" (scored on the test set)" if "cifar10" in splits
                                                                 else "")
    return Outcome(VALIDATION, failure, "a sweep that picks the best test accuracy has fit the test set, which "
                                        "then measures nothing: tune on the held-out cifar10-val")


def stopped(epochs: list[int], max_epochs: int):
    if not any(epochs):
        return Outcome(STOPPED, f"Tune saw no result of any of the {len(epochs)} trials",
                       "Tune sees a Ray Train run's reports only through a callback of the run")
    failure = None
    if all(epoch == max_epochs for epoch in epochs):
        failure = f"all {len(epochs)} trials trained all {max_epochs} epochs"
    return Outcome(STOPPED, failure, "a trial scheduler decides, at each report, whether a trial goes on; without "
                                     "one, Tune runs every trial to its end")
