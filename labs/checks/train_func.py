"""Lab 02's checks: lab 01's solution under torchrun's environment (2 processes, labs.checks.ddp), while Ray starts
and runs the lab's fit() on 2 workers for 1 epoch, then fit() for 2 epochs under the same run name. The workers
record into a file of the check's folder each epoch they train (augment_batch is told the epoch)."""
import tempfile
from pathlib import Path

import ray.train
import torch

from labs.harness import Outcome, ROOT, crashed, lab_args, load_lab, results, start_ranks, start_ray

AS_TORCHRUN = "2 Ray workers report torchrun's loss and accuracy, and keep a checkpoint"
RESUMES = "a run started again under its name resumes after its last checkpoint, ending with torchrun's weights"
TORCHRUN_LAB = ROOT / "labs" / "solutions" / "01_ddp.py"


class RecordingEpochs:
    """augment_batch, writing the epoch of every batch it augments into a file."""

    def __init__(self, augment_batch, log: Path):
        self.augment_batch, self.log = augment_batch, log

    def __call__(self, images, ids, epoch, seed):
        with open(self.log, "a") as log:
            log.write(f"{epoch}\n")
        return self.augment_batch(images, ids, epoch, seed)


def run(lab_file, address) -> list:
    lab = load_lab(lab_file)
    with tempfile.TemporaryDirectory() as folder:
        torchrun_ranks = start_ranks("labs.checks.ddp:watched_main", TORCHRUN_LAB, 2, Path(folder))  # as Ray starts
        start_ray(address)
        try:
            first, resumed = fit_twice(lab, Path(folder))
        except ray.train.TrainingFailedError as error:
            return crashed([AS_TORCHRUN, RESUMES], str(error).strip().splitlines()[-1])
        finally:
            torchrun = results(torchrun_ranks, Path(folder))[0]
    return [as_torchrun(first, torchrun), resumes(first, *resumed, torchrun)]


def fit_twice(lab, folder: Path):
    """The lab's fit() for 1 epoch, then for 2 under the same name: the first run's result, and the second's
    trained epochs and last checkpoint's weights."""
    storage, log = str(folder / "storage"), folder / "epochs"
    lab.augment_batch = RecordingEpochs(lab.augment_batch, log)
    first = lab.fit(lab_args("--epochs", "1"), storage, "lab02")
    log.write_text("")
    resumed = lab.fit(lab_args("--epochs", "2"), storage, "lab02")
    return first, (sorted({int(epoch) + 1 for epoch in log.read_text().split()}), checkpoint_weights(resumed))


def checkpoint_weights(result) -> dict | None:
    if result.checkpoint is None:
        return None
    with result.checkpoint.as_directory() as folder:
        return torch.load(Path(folder) / "checkpoint.pt", weights_only=True)["model"]


def as_torchrun(first, torchrun: dict):
    expected = torchrun["history"][0]
    hint = ("Ray keeps what the workers hand to ray.train.report: rank 0's metrics, and the checkpoint of any rank "
            "that attaches one")
    if first.metrics is None:
        return Outcome(AS_TORCHRUN, "the run reported no metrics (nor a checkpoint)", hint)
    reported = {key: first.metrics.get(key) for key in expected}
    if reported != expected:
        return Outcome(AS_TORCHRUN, f"the run reported {reported}; torchrun's epoch 1 is {expected}", hint)
    if first.checkpoint is None:
        return Outcome(AS_TORCHRUN, "the run kept no checkpoint", hint)
    return Outcome(AS_TORCHRUN, None, hint)


def resumes(first, trained: list[int], weights: dict | None, torchrun: dict):
    hint = ("Ray hands a resumed run's workers the last checkpoint the run reported (ray.train.get_checkpoint); "
            "training starts after its epoch, from its state")
    if trained != [2]:
        kept = "" if first.checkpoint else " (the first run kept no checkpoint)"
        return Outcome(RESUMES, f"the run started again for 2 epochs trained epoch(s) {trained}{kept}", hint)
    if weights is None or any(not torch.equal(weights[k], torchrun["weights"][k]) for k in torchrun["weights"]):
        return Outcome(RESUMES, "the resumed run ended with other weights than torchrun's after 2 epochs", hint)
    return Outcome(RESUMES, None, hint)
