"""The hang clinic's checks (labs 07_hang_*): the diagnosis written in the file against where the untouched file waits
(known here, and shown by its run: tests/test_labs.py), then main() in 2 processes, whose collectives time out after
HANG_TIMEOUT_S, against the recipe in 1 process (labs.reference), both in float64: the run ends, every optimizer step's
gradients are 1 process's, and rank 0's log holds 1 process's loss and accuracy."""
import os
from datetime import timedelta
from pathlib import Path

import torch.distributed.distributed_c10d as c10d

import labs
from labs import reference
from labs.harness import lab_args, load_lab
from labs.outcome import Outcome, crashed
from labs.patching import watch_training
from labs.ranks import RunFailed, run_ranks

DIAGNOSED = "DIAGNOSIS names the rank, the collective and the line where the untouched file waits"
ENDS = "the run ends: every rank calls the same collectives, in the same order, with the same shapes"
SAME_TRAINING = "every step's gradients, and rank 0's logged loss and accuracy, are 1 process's"
CHECKS = [DIAGNOSED, ENDS, SAME_TRAINING]
# How long a rank waits in a collective that the other rank never joins: the untouched file fails in seconds. The
# ranks start together and take well under a second between two collectives, even on a busy 2-core machine. More
# (LABS_HANG_TIMEOUT_S=120) leaves time to run py-spy dump on the waiting ranks.
HANG_TIMEOUT_S = float(os.environ.get("LABS_HANG_TIMEOUT_S", 10))


def run(lab_file, truth: dict, waits_at: str) -> list[Outcome]:
    diagnosed = diagnosis(lab_file, truth, waits_at)
    try:
        alone, pair = run_ranks(f"{__name__}:watched_main", lab_file, 2, lambda: reference.recipe(lab_args().epochs))
    except RunFailed as error:
        return [diagnosed, *crashed(CHECKS[1:], str(error))]
    return [diagnosed, Outcome(ENDS, None, ""), same_training(alone, pair)]


def diagnosis(lab_file, truth: dict, waits_at: str, untouched=None) -> Outcome:
    """The line is right as its number in labs/' copy of the lab (untouched as the tests run it; an attendee's edits
    go there too), as its number in the file checked now (a line added above the collective, a monitored_barrier or
    a print, moves it, and a traceback then shows the new number), or as its statement, which a traceback prints
    under the number. The line is found by its statement, never by a number kept here."""
    written = getattr(load_lab(lab_file), "DIAGNOSIS", None)
    if not isinstance(written, dict) or set(written) != {*truth, "line"}:
        return Outcome(DIAGNOSED, f"DIAGNOSIS is {written!r}, not a dict of {sorted({*truth, 'line'})}",
                       "write down what the tools showed: DIAGNOSIS = dict(rank=..., collective=..., line=...)")
    if None in written.values():
        return Outcome(DIAGNOSED, "DIAGNOSIS is not filled in", "climb the ladder in the lab's docstring: the "
                                                                "timeout's traceback, monitored_barrier, "
                                                                "TORCH_DISTRIBUTED_DEBUG=DETAIL, py-spy dump")
    known = lines_holding(untouched or Path(labs.__file__).parent / Path(lab_file).name, waits_at)
    line = str(written["line"]).strip()
    numbers = {*known, *lines_holding(lab_file, waits_at)}
    line_right = line.startswith(waits_at) or (line.isdigit() and int(line) in numbers)
    wrong = [key for key in truth if normal(written[key]) != normal(truth[key])] + ["line"] * (not line_right)
    if wrong == ["line"] and not known:  # the fix changed that statement in labs/' copy: no number to check against
        return Outcome(DIAGNOSED, f"DIAGNOSIS's line {line} cannot be checked: the lab's file no longer holds the "
                                  "statement where its untouched copy waited",
                       "write the line as that statement, as the traceback printed it under its number")
    if wrong:
        return Outcome(DIAGNOSED, f"DIAGNOSIS's {' and '.join(wrong)} is not where the untouched file waits",
                       "each rank's traceback (or py-spy dump) shows the line it waits on; DETAIL shows each "
                       "rank's collective and shapes side by side")
    return Outcome(DIAGNOSED, None, "")


def lines_holding(path, statement: str) -> list[int]:
    """The numbers of the lines of a file that start with statement."""
    return [number for number, line in enumerate(Path(path).read_text().splitlines(), 1)
            if line.strip().startswith(statement)]


def normal(value) -> str:
    """all_reduce, allreduce, dist.all_reduce and ALLREDUCE are one collective; 0 and "0" one rank."""
    return str(value).lower().removeprefix("dist.").removeprefix("torch.distributed.").replace("_", "")


def watched_main(lab_file) -> dict:
    """In each process: the lab's main(), its collectives timing out after HANG_TIMEOUT_S, every optimizer step's
    gradients recorded."""
    c10d.default_pg_timeout = timedelta(seconds=HANG_TIMEOUT_S)
    watched = watch_training(float64=True)
    history = load_lab(lab_file).main(lab_args())
    return dict(history=history, gradients=watched["gradients"], sharded=watched["sharded"])


def same_training(alone: dict, pair: list[dict]) -> Outcome:
    match reference.first_difference(alone, pair, reference.TOLERANCE):
        case "steps", steps, _:
            return Outcome(SAME_TRAINING, f"rank 0 took {steps} optimizer steps; 1 process takes "
                                          f"{len(alone['steps'])}",
                           "every rank must take 1 process's steps, each on its share of 1 process's batch: a "
                           "sampler that splits every batch over the ranks gives them equal shards")
        case ("ranks differ" | "factor" | "differ") as how, step, _:
            return Outcome(SAME_TRAINING, f"step {step}: the ranks' gradients are not 1 process's ({how})",
                           "each step, the ranks train disjoint halves of 1 process's batch, and DDP averages "
                           "their gradients")
    if len(pair[1]["gradients"]) != len(pair[0]["gradients"]):
        return Outcome(SAME_TRAINING, f"rank 0 took {len(pair[0]['gradients'])} optimizer steps, rank 1 "
                                      f"{len(pair[1]['gradients'])}", "every rank takes the same steps")
    for ours, theirs in zip(alone["history"], pair[0]["history"], strict=False):
        if abs(ours["train_loss"] - theirs["train_loss"]) > reference.TOLERANCE:
            return Outcome(SAME_TRAINING, f"epoch {ours['epoch']}: rank 0 logged train loss "
                                          f"{theirs['train_loss']:.5f}, 1 process {ours['train_loss']:.5f}",
                           "rank 0's log must be every rank's loss: every rank calls the collective that sums it, "
                           "not rank 0 alone, and not nobody")
        if abs(ours["test_accuracy"] - theirs["test_accuracy"]) > 1e-9:
            return Outcome(SAME_TRAINING, f"epoch {ours['epoch']}: rank 0 logged test accuracy "
                                          f"{theirs['test_accuracy']:.2%}, 1 process {ours['test_accuracy']:.2%} on "
                                          f"all {lab_args().eval_images} images",
                           "the accuracy is every image's, each counted once: padding that evens the ranks' "
                           "shapes must not be counted")
    if len(pair[0]["history"]) != len(alone["history"]):
        return Outcome(SAME_TRAINING, f"rank 0 logged {len(pair[0]['history'])} epoch(s) of "
                                      f"{len(alone['history'])}", "rank 0 logs every epoch")
    return Outcome(SAME_TRAINING, None, "")
