"""Lab 02's checks: lab 01's solution under torchrun's environment for 3 epochs, uninterrupted (2 processes,
labs.checks.ddp), while Ray starts and runs the lab's fit() for 2 epochs, then, if that run passed the checks, fit()
for 3 under the same run name. In every process of Ray's job, augment_batch records which images each rank trained in
which epoch, and ray.train.report each report: its rank, its checkpoint, its metrics and a digest of the rank's
weights (labs.watch). Each checkpoint the first run kept is loaded into a plain model, as step 06 loads one, and
compared with rank 0's weights at its epoch's report."""
import tempfile
from pathlib import Path

import torch

from labs import watch
from labs.checks import ddp
from labs.checkpoints import unloadable
from labs.cache import load_reference, save_reference
from labs.harness import ROOT, lab_args, load_lab
from labs.outcome import Outcome, crashed
from labs.ranks import results, start_ranks
from labs.ray_runs import ray_error, start_ray

ON_RAY = "fit() trains train_func on 2 Ray workers in one process group, in the run `name` under storage"
SAME_TRAINING = "the workers train torchrun's shards of every epoch, and keep the same weights (gradients averaged)"
REPORTS = ("every epoch, every rank reports once, and the run keeps rank 0's checkpoint with torchrun's metrics, "
           "which a plain model loads with that epoch's weights")
RESUMES = ("a run started again under its name trains only the epochs left, and its checkpoint then holds what an "
           "uninterrupted run's does: weights, optimizer state, history")
CHECKS = [ON_RAY, SAME_TRAINING, REPORTS, RESUMES]
RESUMES_HINT = ("Ray hands a resumed run's workers the last checkpoint the run reported (ray.train.get_checkpoint): "
                "training goes on after its epoch, from everything it holds, loaded into the model DDP wraps")
TORCHRUN_LAB = ROOT / "labs" / "solutions" / "01_ddp.py"
TORCHRUN = "lab-01-solution-torchrun"  # the reference run's name (labs.cache.load_reference)
NAME, EPOCHS = "lab02", 3  # the second run's epochs; the first run trains lab_args().epochs (2)


def run(lab_file, address) -> list:
    lab = load_lab(lab_file)
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        (folder / "torchrun").mkdir()
        (folder / "calls").mkdir()
        torchrun = load_reference(TORCHRUN)
        if torchrun is None:  # the first time, it runs beside Ray's
            torchrun_ranks = start_ranks(f"{__name__}:uninterrupted", TORCHRUN_LAB, 2, folder / "torchrun")
        start_ray(address, watch.environment(folder / "calls", ["augment_batch", "build_model", "report"]))
        try:
            first, first_calls = fit(lab, folder, lab_args().epochs)
        except Exception as error:  # the run failed (TrainingFailedError), or fit() itself did
            return crashed(CHECKS, ray_error(error))
        finally:
            if torchrun is None:
                torchrun = save_reference(TORCHRUN, results(torchrun_ranks, folder / "torchrun"))
        outcomes = [on_ray(first, first_calls, folder / "storage"), same_training([first_calls], torchrun),
                    reports(first, first_calls, torchrun[0])]
        if not all(outcome.passed for outcome in outcomes):
            # A resume is compared with an uninterrupted run: the first run must train as that run does.
            return [*outcomes, Outcome(RESUMES, "not run: the first run fails a check above", "")]
        try:
            resumed, resumed_calls = fit(lab, folder, EPOCHS)
        except Exception as error:  # the resumed run alone failed
            return [*outcomes, Outcome(RESUMES, f"the run started again did not finish: {ray_error(error)}",
                                       RESUMES_HINT)]
        return [outcomes[0], same_training([first_calls, resumed_calls], torchrun), outcomes[2],
                resumes(resumed, resumed_calls, torchrun[0])]


def uninterrupted(lab_file) -> dict:
    return ddp.watched_main(lab_file, "--epochs", str(EPOCHS), float64=False)  # as Ray's workers train


def fit(lab, folder: Path, epochs: int) -> tuple:
    """The lab's fit() for these epochs under the run's name: its result, and the calls its workers made."""
    result = lab.fit(lab_args("--epochs", str(epochs)), str(folder / "storage"), NAME)
    calls = watch.read(folder / "calls")
    for file in (folder / "calls").iterdir():
        file.unlink()
    return result, calls


def trained(calls: list[dict], function: str = "augment_batch") -> list[dict]:
    return [call for call in calls if call["function"] == function]


def on_ray(first, calls: list[dict], storage: Path):
    steps = trained(calls)
    processes, groups = {call["pid"] for call in steps}, sorted({call["group"] for call in steps})
    failure = None
    if not steps:
        failure = "no Ray worker trained anything"
    elif any(call["actor"] is None for call in steps):
        failure = "train_func ran outside Ray's workers (in the driver?)"
    elif len(processes) != 2 or groups != [2]:
        failure = f"{len(processes)} Ray worker(s) trained, in process groups of {groups}"
    elif not hasattr(first, "checkpoint"):
        failure = f"fit() returned {first!r}, not the run's Result"
    elif not (storage / NAME).is_dir():
        failure = f"nothing under storage/{NAME}: the run is named otherwise, or stored elsewhere"
    return Outcome(ON_RAY, failure, "TorchTrainer runs train_func in each worker that ScalingConfig asks for (Ray "
                                    "starts their process group); RunConfig names the run and its storage")


def same_training(runs: list[list[dict]], torchrun: list[dict]):
    """Each rank's images, epoch by epoch, against torchrun's ranks'; the ranks' weights at every report of each
    run (the calls of each run)."""
    expected = {(rank["rank"], step["epoch"], tuple(step["ids"])) for rank in torchrun for step in rank["steps"]}
    steps = {(call["rank"], call["epoch"], tuple(call["ids"])) for calls in runs for call in trained(calls)}
    if not steps:
        return Outcome(SAME_TRAINING, "no worker trained (above)", "")
    if not steps <= expected:
        return Outcome(SAME_TRAINING, "the workers trained other images than torchrun's ranks, in some epoch",
                       "each worker trains its own shard of the data (the sampler, which Ray's prepare_data_loader "
                       "keeps), shuffled with --seed and anew each epoch (set_epoch)")
    for reports in (trained(calls, "report") for calls in runs):
        for epoch in sorted({report["metrics"].get("epoch") for report in reports}, key=str):
            digests = {report["weights"] for report in reports if report["metrics"].get("epoch") == epoch}
            if len(digests) > 1:
                return Outcome(SAME_TRAINING, f"at the report of epoch {epoch}, rank 0's and rank 1's weights differ",
                               "each worker's gradients come from its own images: DDP averages them over the "
                               "workers in backward (Ray's prepare_model wraps the model in it)")
    return Outcome(SAME_TRAINING, None, "")


def reports(first, calls: list[dict], torchrun: dict):
    hint = ("ray.train.report is how a worker hands Ray its metrics and checkpoint, once per epoch on every rank: "
            "Ray keeps rank 0's metrics, and the checkpoint of any rank that attaches one")
    epochs = lab_args().epochs
    made = [sum(1 for report in trained(calls, "report") if report["rank"] == rank) for rank in (0, 1)]
    kept = getattr(first, "best_checkpoints", None) or []
    expected = torchrun["history"][:epochs]
    if made != [epochs, epochs]:
        failure = f"in {epochs} epochs, rank 0 reported {made[0]} time(s), rank 1 {made[1]}"
    elif len(kept) != epochs:
        failure = f"the run kept {len(kept)} checkpoint(s) in {epochs} epochs"
    elif [{key: metrics.get(key) for key in expected[0]} for _, metrics in kept] != expected:
        failure = f"the run's checkpoints came with {[metrics for _, metrics in kept]}; torchrun's epochs: {expected}"
    else:
        failure, hint = unloadable(kept, trained(calls, "report"), "checkpoint.pt",
                                   lambda saved: saved["model"]) or (None, hint)
    return Outcome(REPORTS, failure, hint)


def resumes(resumed, calls: list[dict], torchrun: dict):
    epochs = sorted({call["epoch"] + 1 for call in trained(calls)})
    if epochs != [EPOCHS]:
        return Outcome(RESUMES, f"the run started again for {EPOCHS} epochs trained epoch(s) {epochs}", RESUMES_HINT)
    state = last_checkpoint(resumed)
    if state is None:
        return Outcome(RESUMES, "the run started again kept no checkpoint", RESUMES_HINT)
    differing = [field for field, same in [
        ("weights", equal(state.get("model"), torchrun["weights"])),
        ("optimizer state", equal(state.get("optimizer", {}).get("state"), torchrun["optimizer"]["state"])),
        ("history", state.get("history") == torchrun["history"]),
        ("epoch", state.get("epoch") == EPOCHS - 1)] if not same]
    if differing:
        return Outcome(RESUMES, f"after the resumed run, the checkpoint's {', '.join(differing)} differ(s) from an "
                                f"uninterrupted run's ({EPOCHS} epochs of torchrun)", RESUMES_HINT)
    return Outcome(RESUMES, None, RESUMES_HINT)


def last_checkpoint(result) -> dict | None:
    if getattr(result, "checkpoint", None) is None:
        return None
    with result.checkpoint.as_directory() as folder:
        return torch.load(Path(folder) / "checkpoint.pt", weights_only=True)


def equal(a, b) -> bool:
    """Two nested dicts of tensors, bit for bit."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and torch.equal(a, b)
    return a == b
