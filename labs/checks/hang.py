"""Lab 02-hang's checks: the lab's train_func on 2 Ray workers, with Ray's collective timeout set so that a report
that one rank never joins ends the run with an error. Each worker counts its calls of ray.train.report into a
file of the check's folder."""
import tempfile
from pathlib import Path

import ray
import ray.train
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from common.ray_setup import quiet_report_logs
from labs.harness import Outcome, lab_args, load_lab, start_ray

ENDS = "the run ends, within Ray's collective timeout"
EQUAL_REPORTS = "every rank calls ray.train.report equally often: once per epoch"
COLLECTIVE_TIMEOUT_S = 10


def run(lab_file, address) -> list:
    lab = load_lab(lab_file)
    start_ray(address, RAY_TRAIN_COLLECTIVE_TIMEOUT_S=str(COLLECTIVE_TIMEOUT_S))
    with tempfile.TemporaryDirectory() as folder:
        trainer = TorchTrainer(counting_reports(lab.train_func, folder), train_loop_config=vars(lab_args()),
                               scaling_config=ScalingConfig(num_workers=2), run_config=RunConfig(storage_path=folder))
        try:
            trainer.fit()
            error = None
        except ray.train.TrainingFailedError as failed:
            error = timeout_line(str(failed))
        reports = [int((Path(folder) / f"reports{rank}").read_text() or 0) for rank in (0, 1)]
    ray.shutdown()
    return [ends(error), equal_reports(reports)]


def timeout_line(error: str) -> str:
    """Ray's line that names the ranks that never joined, else the error's last line."""
    lines = error.strip().splitlines()
    return next((line for line in lines if "have not joined" in line), lines[-1])


def counting_reports(train_func, folder):
    """train_func, in a worker where ray.train.report counts its calls into folder/reports<rank>."""
    def train_func_counting_reports(config):
        quiet_report_logs()
        report, counter = ray.train.report, Path(folder) / f"reports{ray.train.get_context().get_world_rank()}"
        counter.write_text("0")

        def counting_report(*args, **kwargs):
            counter.write_text(str(int(counter.read_text()) + 1))
            return report(*args, **kwargs)

        ray.train.report = counting_report
        train_func(config)
    return train_func_counting_reports


def ends(error: str | None):
    return Outcome(ENDS, error and f"the run hung; Ray's timeout ended it: {error}",
                   "ray.train.report is a barrier across the workers: a rank that calls it waits there for every "
                   "other rank")


def equal_reports(reports: list[int]):
    epochs = lab_args().epochs
    failure = None
    if reports != [epochs, epochs]:
        failure = f"rank 0 called ray.train.report {reports[0]} time(s), rank 1 {reports[1]}, in {epochs} epochs"
    return Outcome(EQUAL_REPORTS, failure, "every rank reports, with a checkpoint or without one; Ray keeps rank "
                                           "0's metrics, and the checkpoint of any rank that attaches one")
