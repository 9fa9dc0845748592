"""Lab 02-hang's checks: the lab's train_func on 2 Ray workers, with Ray's collective timeout set so that a report
that one rank never joins ends the run with an error (labs.ray_runs.start_ray). In every process of Ray's job,
ray.train.report records each call: its rank, whether it attached a checkpoint, its metrics and a digest of the
rank's weights (of the model build_model built, labs.watch). Each checkpoint the run kept is then loaded into a plain
model, as step 06 loads one, and compared with rank 0's weights at its epoch's report."""
import tempfile
from pathlib import Path

import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from labs import watch
from labs.checkpoints import unloadable
from labs.harness import lab_args, load_lab
from labs.outcome import Outcome
from labs.ranks import COLLECTIVE_TIMEOUT_S
from labs.ray_runs import ray_error, start_ray

ENDS = f"the run ends without an error: no report waits {COLLECTIVE_TIMEOUT_S} s for a rank that never joins it"
EQUAL_REPORTS = "every rank calls ray.train.report equally often: once per epoch"
ONE_CHECKPOINT = ("rank 0 alone attaches a checkpoint, and the run keeps one per epoch, which a plain model loads "
                  "with that epoch's weights")
CHECKS = [ENDS, EQUAL_REPORTS, ONE_CHECKPOINT]


def run(lab_file, address) -> list:
    lab = load_lab(lab_file)
    with tempfile.TemporaryDirectory() as folder:
        start_ray(address, watch.environment(folder, ["build_model", "report"]))
        trainer = TorchTrainer(lab.train_func, train_loop_config=vars(lab_args()),
                               scaling_config=ScalingConfig(num_workers=2),
                               run_config=RunConfig(storage_path=str(Path(folder, "storage"))))
        try:
            result, error = trainer.fit(), None
        except Exception as failed:  # TrainingFailedError, with Ray's timeout among its lines
            result, error = None, ray_error(failed)
        reports = [call for call in watch.read(folder) if call["function"] == "report"]
        outcomes = [ends(error), equal_reports(reports), one_checkpoint(reports, result)]  # while storage is there
    ray.shutdown()
    return outcomes


def ends(error: str | None):
    hint = "ray.train.report is a barrier across the workers: a rank that calls it waits there for every other rank"
    if error and "No such file" in error:
        hint = ("Ray copies the checkpoint's folder into storage during ray.train.report: report before the "
                "temporary folder is deleted (inside its with-block)")
    return Outcome(ENDS, error and f"the run failed: {error}", hint)


def made(reports: list[dict], checkpoint: bool = False) -> list[int]:
    """How many reports each rank made (with a checkpoint attached only, if asked)."""
    return [sum(1 for r in reports if r["rank"] == rank and (r["checkpoint"] or not checkpoint)) for rank in (0, 1)]


def equal_reports(reports: list[dict]):
    epochs, counts = lab_args().epochs, made(reports)
    failure = None
    if counts != [epochs, epochs]:
        failure = f"rank 0 called ray.train.report {counts[0]} time(s), rank 1 {counts[1]}, in {epochs} epochs"
    return Outcome(EQUAL_REPORTS, failure, "every rank reports, with a checkpoint or without one; Ray keeps rank "
                                           "0's metrics, and the checkpoint of any rank that attaches one")


def one_checkpoint(reports: list[dict], result):
    epochs, attached = lab_args().epochs, made(reports, checkpoint=True)
    kept = getattr(result, "best_checkpoints", None) or []
    failure, hint = None, ("DDP's ranks hold the same weights: one rank's copy is the checkpoint, another's would "
                           "only be written and uploaded again")
    if attached != [epochs, 0]:
        failure = f"rank 0 attached a checkpoint {attached[0]} time(s), rank 1 {attached[1]}, in {epochs} epochs"
    elif len(kept) != epochs:
        failure = f"the run kept {len(kept)} checkpoint(s) in {epochs} epochs"
    else:
        failure, hint = unloadable(kept, reports, "model.pt") or (None, hint)
    return Outcome(ONE_CHECKPOINT, failure, hint)
