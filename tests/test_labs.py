"""The labs (labs/README.md): on its untouched starting file, every check of a lab fails, for the reason the lab
teaches; on its solution, every check passes; and what a solution adds to its starting file is the step script's
code for that lesson."""
import argparse
import ast
import importlib
import multiprocessing
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest
import torch
from torch.distributed.fsdp import FSDPModule

from common.model import build_model
from labs.check import LABS
from labs.checks import clinic

import processes
from checks import load_script
from conftest import RAY_DDP, RAY_FSDP2, ROOT, two_node_cluster
from early import takes
from suite_rules import time_limit

pytestmark = pytest.mark.labs

# What lab 05's check says of a check that needs the sweep, when SEARCH_SPACE fails and no sweep runs.
NO_SWEEP = "not run: no sweep over a SEARCH_SPACE that fails its check"
# What each check reports on the untouched starting file, in the order the check prints them: a substring, or a
# pattern where the failure names a measured number.
STARTING_FAILURES = {
    "01": ["the 2 processes trained in process groups of [1] (each alone), not one group of 2",
           "in epoch 1, rank 0 and rank 1 both trained 64 of the same images",
           "step 1: the ranks' gradients differ from 1 process's on the whole batch by",
           "epoch 1: rank 0 reported train loss",
           re.compile(r"rank 0 reported (\S+) \(its own 32 test images give \1\); all 63 images give")],
    "02": ["no Ray worker trained anything", "no worker trained (above)",
           "in 2 epochs, rank 0 reported 0 time(s), rank 1 0",
           "not run: the first run fails a check above"],
    "02-hang": ["The following ranks have not joined the collective operation: [1]",
                "rank 0 called ray.train.report 1 time(s), rank 1 0, in 2 epochs",
                "rank 0 attached a checkpoint 1 time(s), rank 1 0, in 2 epochs"],
    "04": ["rank 0 holds 832,682 of the 832,682 parameter values (832,682 of them whole, not sharded)",
           "step 1: the gradients of the parameters left whole differ between the ranks",
           "0 all-gathers per step; 6 blocks and the root make 13"],
    "04-accumulate": ["8 optimizer steps for 4 batches of 2 micro-batches",
                      "14 reduce-scatters per optimizer step of 2 micro-batches; the model's 7 units need 7",
                      "8 losses reported for 4 optimizer steps"],
    # The untouched SEARCH_SPACE is empty: no sweep runs (the other checks' failures: its wrong answers).
    "05": [NO_SWEEP, "SEARCH_SPACE has no Tune distribution for lr: None", NO_SWEEP, NO_SWEEP, NO_SWEEP, NO_SWEEP],
    "06": [re.compile(r"the model ran in \d process\(es\) that are not actors"),
           re.compile(r"the model was built 4 times, in \d process\(es\), for 4 batches"),
           "the output rows have columns ['predicted', 'probability']: no id and label say which image"],
    "07": ["self_attention.q's weight is whole on every rank",
           "nothing to compare: no layer of a block is split, each rank computes the whole model",
           "per step: none; 6 blocks' 2 column-to-row pairs make 12 all-reduces in forward and 12 to 24 in backward"],
    "hang-rank0": ["DIAGNOSIS is not filled in",
                   "the run hung: RuntimeError: Timed out waiting 10000ms for recv operation to complete",
                   "the run did not finish (above)"],
    "hang-uneven": ["DIAGNOSIS is not filled in",
                    "the run hung: RuntimeError: Timed out waiting 10000ms for recv operation to complete",
                    "the run did not finish (above)"],
    # gloo aborts the rank that receives more bytes than its tensor holds; the other reads its peer's end
    "hang-shape": ["DIAGNOSIS is not filled in", re.compile(r"the run hung: RuntimeError: .* (reset|closed) by peer"),
                   "the run did not finish (above)"],
}
# The step script whose lesson each lab is.
STEP_SCRIPTS = {
    "01": "01-vanilla-pytorch-ddp/train_ddp.py",
    "02": RAY_DDP,
    "02-hang": RAY_DDP,
    "04-accumulate": RAY_FSDP2,
    "07": "07-tensor-parallel/train_ray_tp.py",
}
# What a solution adds that its step script writes otherwise, and why. Lab 02's: the script's run also has a
# FailureConfig, a LoggingConfig and a CheckpointConfig, and prints its result (its report is the script's, word for
# word, since the script's report carries the epoch's metrics alone).
UNLIKE_THE_SCRIPT = {
    # Lab 07's mesh is TP's alone (1-D); the script's has a dp dimension too, and takes its tp one.
    "07": {"parallelize_module(module, mesh, TP_PLAN)"},
    "02": {"trainer = TorchTrainer(train_func, train_loop_config=vars(args), scaling_config=ScalingConfig("
           "num_workers=2), run_config=RunConfig(name=name, storage_path=storage))",
           "return trainer.fit()"},
}
STEP_05 = "05-ray-tune/tune_ray_ddp.py"
# The Ray labs whose checks mostly wait (on Ray starting processes, on reports, on a collective's timeout): they run
# early (early_lab_checks), and the other tests use the cores meanwhile.
EARLY_LABS = ("02-hang", "05", "06")
STEP_06 = "06-ray-data-inference/batch_inference.py"
# The checks' budget is 60 s on 2 cores; the tests leave room for a machine shared with other work.
CHECK_TIMEOUT_S = 280  # within pytest-timeout's 300 s per test


@pytest.fixture(autouse=True, scope="module")
def reference_runs_of_this_suite(tmp_path_factory):
    """The checks' reference runs (labs.cache.CACHE) kept for this suite alone: the first check of a lab runs them,
    the next ones read them back."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LABS_CACHE", str(tmp_path_factory.mktemp("labs-cache")))
        yield


@pytest.fixture
@time_limit(3600)  # the early run's own deadline bounds the wait
def ran_early(request) -> dict | None:
    """What early_lab_checks printed, for a test marked early; None for the others, which run their check now."""
    return request.getfixturevalue("early_run") if request.node.get_closest_marker("early") else None


@pytest.fixture(scope="module")
def preloaded(reference_runs_of_this_suite) -> processes.Preloaded:
    """python -m labs.check, forked from a process that has imported the checks of the labs that run now."""
    server = check_server([lab for lab in LABS if lab not in EARLY_LABS])
    yield server
    server.close()


def check_server(labs, folder=None) -> processes.Preloaded:
    """python -m labs.check, forked from a server that has imported these labs' checks."""
    return processes.Preloaded("labs.check", *sorted({LABS[lab].checks for lab in labs}), folder=folder)


def check(request, ran_early, lab: str, case: str, file=None) -> subprocess.CompletedProcess:
    """python -m labs.check LAB [--file FILE], forked from the preloaded server; a Ray lab's on the shared test
    cluster, which is started once for every Ray test. The checks of EARLY_LABS ran early (early_lab_checks): this
    case's (untouched, solution, a wrong answer)."""
    if ran_early is not None:
        return ran_early[lab, case]
    address = request.getfixturevalue("ray_cluster") if LABS[lab].ray else None
    return run_check(lab, file, address, request.getfixturevalue("preloaded").run)


def run_check(lab: str, file, address: str | None, run=processes.run) -> subprocess.CompletedProcess:
    flags = [*(["--file", str(file)] if file else []), *(["--address", address] if address else [])]
    return run([sys.executable, "-m", "labs.check", lab, *flags], timeout=CHECK_TIMEOUT_S)


# The checks of EARLY_LABS run in two early runs: on the untouched files and the solutions (the README's tier), and
# on every wrong and right answer (the slow tier: tests/tiers.py). The answers' run took 705 s in the full suite at
# 48cb1b6; 617 and 568 s once lab 05's check ran no sweep over a search space that fails (9e2e582, 3f730ef; AMD EPYC
# Zen 5, 2026-11-29). Lab 05's wrong answers then ran 4 sweeps, now 10: 1118 and 1552 s with `-k 05` (62 to 162 s a
# sweep) beside other work on the machine (load 4 to 14). Two right answers (RIGHT_ANSWERS) added a sweep of lab 05
# (57 s alone) and a check of lab 06 (12 s) on an Intel Xeon, 2026-12-04; lab 05's was dropped since. 1499 s in the
# full suite at 4999274 (AMD EPYC Zen 4, 2026-12-04), before lab 05's right answer came back, a sweep on a Ray of its
# own (RIGHT_ANSWERS says why). Lab 05's check stops a sweep at a failure no later trial can pass since 5e09a3f, and
# at a first trial with no decision of ASHA's since 8536c38: its 10 sweeping wrong answers took 664 s alone, then 473,
# then 446 (AMD EPYC Zen 4, tests/history/account/lab05-cut/).
@takes(300)
def early_lab_checks(folder, lane) -> dict:
    """The checks of EARLY_LABS on their untouched files and their solutions (early_checks)."""
    return early_checks(folder, {(lab, case): file for lab in EARLY_LABS for case, file in
                                 (("untouched", None), ("solution", lab_file(lab, "labs/solutions")))})


@takes(1600)
def early_lab_answers(folder, lane) -> dict:
    """The checks of EARLY_LABS on each wrong and right answer (lab 05's each a sweep of 3 trials, about 50 s)."""
    files, own_ray = {}, set()
    for lab in EARLY_LABS:
        for i, answer in enumerate([*WRONG_ANSWERS[lab], *RIGHT_ANSWERS.get(lab, [])]):
            files[lab, answer.name] = folder / f"{lab}-answer-{i}" / LABS[lab].file
            files[lab, answer.name].parent.mkdir()
            files[lab, answer.name].write_text(
                wrong_answer(lab, answer) if isinstance(answer, WrongAnswer) else edited(lab, answer.edits))
            if isinstance(answer, RightAnswer) and answer.on_its_own_ray:
                own_ray.add((lab, answer.name))
    return early_checks(folder, files, own_ray)


def early_checks(folder, files: dict, own_ray: set = frozenset()) -> dict:
    """The checks of these {(lab, case): file}: in the early lane, beside the other tests, on a two-node cluster of
    their own (the cases in own_ray on a Ray of their own), with reference runs of their own, forked from a server
    that imported their checks (processes.Preloaded; their output in the run's folder). {(lab, case): what the
    check printed}."""
    os.environ["LABS_CACHE"] = str(folder / "labs-cache")  # this process's, handed on to the checks
    cluster = two_node_cluster()
    checks = check_server(EARLY_LABS, folder)
    try:
        return {(lab, case): check_on_time(lab, file, None if (lab, case) in own_ray else cluster.address, checks.run)
                for (lab, case), file in files.items()}
    finally:
        checks.close()
        cluster.shutdown()


def check_on_time(lab: str, file, address: str, run) -> subprocess.CompletedProcess:
    """run_check, where a check past its deadline fails its own test (no exit code, what it printed, and a line that
    says so), not every test of the lane."""
    try:
        return run_check(lab, file, address, run)
    except subprocess.TimeoutExpired as late:
        return subprocess.CompletedProcess(late.cmd, None, late.stdout or "", f"{late.stderr or ''}\nthe check of "
                                           f"{lab} ran past its {late.timeout:g} s")


def on_time(lab: str, *values, run=early_lab_checks):
    """The parameters of a test of this lab's check: marked early, with this run, for EARLY_LABS."""
    return pytest.param(lab, *values, marks=[pytest.mark.early(run=run)] if lab in EARLY_LABS else [])


def verdicts(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith(("PASS", "FAIL"))]


def shows(line: str, failure) -> bool:
    return bool(failure.search(line)) if isinstance(failure, re.Pattern) else failure in line


def lab_file(lab: str, folder: str = "labs"):
    return ROOT / folder / LABS[lab].file


@pytest.mark.parametrize("lab", [on_time(lab) for lab in LABS])
def test_every_check_fails_on_the_untouched_lab_for_its_lesson(request, ran_early, lab):
    result = check(request, ran_early, lab, "untouched")
    lines = verdicts(result.stdout)
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    assert len(lines) == len(STARTING_FAILURES[lab]), result.stdout
    for line, failure in zip(lines, STARTING_FAILURES[lab], strict=True):
        assert line.startswith("FAIL") and shows(line, failure), (line, failure)
    if lab.startswith("hang-"):  # the clinic's truth is where the untouched file's traceback says it waits
        line, = clinic.lines_holding(lab_file(lab), importlib.import_module(LABS[lab].checks).WAITS_AT)
        shown = f'{LABS[lab].file}", line {line}, in' in result.stderr
        # Or gloo ended the rank at that collective at once, with no traceback (the other rank may have gone on).
        aborted = lab == "hang-shape" and "Received data size doesn't match expected size" in result.stderr
        assert shown or aborted, result.stderr[-3000:]


@pytest.mark.parametrize("lab", [on_time(lab) for lab in LABS])
def test_every_check_passes_on_the_solution(request, ran_early, lab):
    assert_passes(lab, check(request, ran_early, lab, "solution", lab_file(lab, "labs/solutions")))


@dataclass
class WrongAnswer:
    """A mistake people make, written as edits of the lab's solution or starting file (each old text must be there),
    and what the
    check must say: the number of the check that fails (counted from 1, in the order the check prints them), words
    of what it saw, and words of its hint, which names the concept."""
    name: str
    edits: list[tuple[str, str]]
    check: int
    failure: str
    hint: str
    of_the_starting_file: bool = False  # edits of the untouched file instead
    # The file imports common's modules under other names (imported_otherwise): the checks replace common's functions
    # in the modules that define them, in torchrun's processes, in Ray Train's workers (the functions pickled with
    # train_func) and in Ray Data's actors, so they watch it all the same and the checks before the failing one pass.
    imported_otherwise: bool = False


WRONG_ANSWERS = {
    "01": [
        WrongAnswer("no set_epoch", [("        sampler.set_epoch(epoch)\n", "")],
                    2, "epoch 2 repeated epoch 1's order", "it knows the epoch only if told"),
        WrongAnswer("a sampler with its own seed", [("seed=args.seed, drop_last=True", "drop_last=True")],
                    2, "images are not those 1 process shuffling with --seed 1 trains", "with the run's seed"),
        WrongAnswer("no DDP", [("    model = DistributedDataParallel(model)\n", "")],
                    3, "step 1: rank 0's and rank 1's gradients differ", "average them over the ranks in backward",
                    imported_otherwise=True),
        WrongAnswer("gradients summed by hand", [
            ("    model = DistributedDataParallel(model)\n", ""),
            ("            loss.backward()\n", "            loss.backward()\n            for p in model.parameters():\n"
                                               "                dist.all_reduce(p.grad)\n")],
                    3, "the ranks' gradients are 2.00 times 1 process's", "averaged, not summed"),
        WrongAnswer("the loss summed over the ranks", [("/ steps_per_epoch / world_size", "/ steps_per_epoch")],
                    4, "epoch 1: rank 0 reported train loss", "divided by their number"),
        WrongAnswer("rank 0's loss", [("        dist.all_reduce(loss_sum)", "        pass")],
                    4, "epoch 1: rank 0 reported train loss", "the mean over every rank's"),
        WrongAnswer("the mean of the ranks' accuracies", [(
            "        dist.all_reduce(tally)  # each rank scored a disjoint shard of the test set\n"
            "        correct, counted = tally.tolist()\n",
            "        accuracy = tally[0] / tally[1]\n        dist.all_reduce(accuracy)\n"
            "        correct, counted = accuracy.item() / world_size, 1\n")],
                    5, "all 63 images give", "the shards differ in size"),
        WrongAnswer("rank 0's accuracy", [("        dist.all_reduce(tally)", "        pass")],
                    5, "its own 32 test images give", "add up every rank's [correct, counted]"),
        WrongAnswer("the group never left", [
            ("    try:\n        return train(args, rank, world_size, torch.device(\"cpu\"))\n    finally:\n"
             "        dist.destroy_process_group()\n",
             "    return train(args, rank, world_size, torch.device(\"cpu\"))\n")],
                    1, "the process group was still open when main() returned", "destroy_process_group"),
        WrongAnswer("the accuracy reduced on rank 0 only", [
            ("        dist.all_reduce(tally)", "        if rank == 0:\n            dist.all_reduce(tally)")],
                    1, "the run hung: RuntimeError", "the same collectives, in the same order"),
    ],
    "02": [
        WrongAnswer("a report on rank 0 only", [
            ("            ray.train.report(history[-1], checkpoint=checkpoint)",
             "                ray.train.report(history[-1], checkpoint=checkpoint)")],
                    1, "have not joined", "ray.train.report"),
        WrongAnswer("one worker", [("ScalingConfig(num_workers=2)", "ScalingConfig(num_workers=1)")],
                    1, "1 Ray worker(s) trained, in process groups of [1]", "ScalingConfig"),
        WrongAnswer("a run without a name", [("RunConfig(name=name, storage_path=storage)",
                                              "RunConfig(storage_path=storage)")],
                    1, "nothing under storage/lab02", "RunConfig names the run"),
        WrongAnswer("no prepare_model", [("    model = ray.train.torch.prepare_model(model)\n", "")],
                    2, "rank 0's and rank 1's weights differ", "prepare_model"),
        WrongAnswer("a checkpoint at the last epoch only", [
            ("            if master_process:\n                save_checkpoint",
             "            if master_process and epoch + 1 == args.epochs:\n                save_checkpoint")],
                    3, "the run kept 1 checkpoint(s) in 2 epochs", "once per epoch on every rank"),
        WrongAnswer("DDP's wrapper checkpointed", [
            ("state = dict(model=raw_model.state_dict(),", "state = dict(model=model.state_dict(),")],
                    3, "the checkpoint of epoch 1 holds DDP's wrapper's keys (module.<name>)",
                    "save the model it wraps (model.module)"),
        WrongAnswer("the checkpoint written after its report", [
            ("                save_checkpoint(Path(checkpoint_dir) / \"checkpoint.pt\", state)\n", ""),
            ("            ray.train.report(history[-1], checkpoint=checkpoint)\n",
             "            ray.train.report(history[-1], checkpoint=checkpoint)\n            if master_process:\n"
             "                save_checkpoint(Path(checkpoint_dir) / \"checkpoint.pt\", state)\n")],
                    3, "the checkpoint of epoch 1 holds nothing (an empty folder), no checkpoint.pt",
                    "write checkpoint.pt into it before the report"),
        WrongAnswer("the checkpoint saved as its epoch starts", [
            ("        sampler.set_epoch(epoch)\n",
             "        sampler.set_epoch(epoch)\n        start_dir = tempfile.mkdtemp()\n        if master_process:\n"
             "            save_checkpoint(Path(start_dir) / \"checkpoint.pt\", dict(\n"
             "                model=raw_model.state_dict(), optimizer=optimizer.state_dict(), epoch=epoch,\n"
             "                history=history, model_preset=args.model))\n"),
            ("                save_checkpoint(Path(checkpoint_dir) / \"checkpoint.pt\", state)\n"
             "                checkpoint = ray.train.Checkpoint.from_directory(checkpoint_dir)\n",
             "                checkpoint = ray.train.Checkpoint.from_directory(start_dir)\n")],
                    3, "the checkpoint of epoch 1 holds the weights rank 0 held at no report, not at that epoch's",
                    "save them after the epoch's training"),
        WrongAnswer("a resume without the optimizer's state", [
            ("        optimizer.load_state_dict(state[\"optimizer\"])\n", "")],
                    4, "the checkpoint's weights, optimizer state", "from everything it holds"),
        WrongAnswer("a resume without the history", [
            ("start_epoch, history = state[\"epoch\"] + 1, state[\"history\"]", "start_epoch = state[\"epoch\"] + 1")],
                    4, "the checkpoint's history differ(s)", "from everything it holds"),
        WrongAnswer("a resume at the checkpoint's epoch", [("state[\"epoch\"] + 1,", "state[\"epoch\"],")],
                    4, "trained epoch(s) [2, 3]", "goes on after its epoch", imported_otherwise=True),
        WrongAnswer("the checkpoint loaded into DDP's wrapper", [
            ("raw_model.load_state_dict(state[\"model\"])", "model.load_state_dict(state[\"model\"])")],
                    4, "the run started again did not finish: RuntimeError: Error(s) in loading state_dict for "
                       "DistributedDataParallel", "loaded into the model DDP wraps"),
    ],
    "02-hang": [
        WrongAnswer("a checkpoint from every rank", [
            ("            checkpoint = None\n            if master_process:\n"
             "                torch.save(model.module.state_dict(), Path(checkpoint_dir) / \"model.pt\")\n"
             "                checkpoint = ray.train.Checkpoint.from_directory(checkpoint_dir)\n",
             "            torch.save(model.module.state_dict(), Path(checkpoint_dir) / \"model.pt\")\n"
             "            checkpoint = ray.train.Checkpoint.from_directory(checkpoint_dir)\n")],
                    3, "rank 0 attached a checkpoint 2 time(s), rank 1 2", "one rank's copy is the checkpoint"),
        WrongAnswer("a report after the last epoch only", [
            ("            ray.train.report(dict(epoch=epoch + 1, train_loss=loss.item()), checkpoint=checkpoint)",
             "            if epoch + 1 == args.epochs:\n"
             "                ray.train.report(dict(epoch=epoch + 1, train_loss=loss.item()), checkpoint=checkpoint)")],
                    2, "rank 0 called ray.train.report 1 time(s), rank 1 1, in 2 epochs", "every rank reports"),
        WrongAnswer("a barrier on rank 1 instead of its report", [
            ("            ray.train.report(dict(epoch=epoch + 1, train_loss=loss.item()), checkpoint=checkpoint)",
             "            if master_process:\n"
             "                ray.train.report(dict(epoch=epoch + 1, train_loss=loss.item()), checkpoint=checkpoint)\n"
             "            else:\n                torch.distributed.barrier()  # while rank 0 reports")],
                    1, "have not joined the collective operation: [1]", "ray.train.report is a barrier"),
        WrongAnswer("a report once the checkpoint's folder is gone", [
            ("            # Ray keeps rank 0's metrics only and copies the checkpoint to storage. A barrier: every "
             "rank must\n            # call report, and equally often.\n            ray.train.report(",
             "        ray.train.report(")],
                    1, "No such file or directory", "report before the temporary folder is deleted"),
        WrongAnswer("the checkpoint written after its report", [
            ("                torch.save(model.module.state_dict(), Path(checkpoint_dir) / \"model.pt\")\n", ""),
            ("checkpoint=checkpoint)\n", "checkpoint=checkpoint)\n            if master_process:\n"
                                          "                torch.save(model.module.state_dict(), "
                                          "Path(checkpoint_dir) / \"model.pt\")\n")],
                    3, "the checkpoint of epoch 1 holds nothing (an empty folder), no model.pt",
                    "write model.pt into it before the report"),
        WrongAnswer("DDP's wrapper checkpointed", [
            ("torch.save(model.module.state_dict()", "torch.save(model.state_dict()")],
                    3, "the checkpoint of epoch 1 holds DDP's wrapper's keys (module.<name>)",
                    "save the model it wraps (model.module)"),
    ],
    "05": [
        WrongAnswer("tuned on the test set", [("dict(vars(args), data=\"cifar10-val\", **SEARCH_SPACE)",
                                               "dict(vars(args), **SEARCH_SPACE)")],
                    1, "255 from the test set (cifar10-val holds out 255); they asked load_data for ['cifar10']",
                    "it fits the test set"),
        WrongAnswer("scored on training images held out by hand", [
            ("evaluate(model, data.test_images, data.test_labels, device)",
             "evaluate(model, data.train_images[-args.eval_images:], data.train_labels[-args.eval_images:], device)")],
                    1, "255 from cifar10-val's training images (cifar10-val holds out 255); they asked load_data for "
                       "['cifar10-val']", "it rewards memorising them"),
        WrongAnswer("trained on cifar10-val, scored on the test set", [
            ("        correct, counted = evaluate(model, data.test_images, data.test_labels, device).tolist()\n",
             "        test = load_data(\"cifar10\", args.data_dir, args.eval_images)\n"
             "        correct, counted = evaluate(model, test.test_images, test.test_labels, device).tolist()\n")],
                    1, "255 from the test set (cifar10-val holds out 255); they asked load_data for ['cifar10', "
                       "'cifar10-val']", "it fits the test set"),
        WrongAnswer("lr on a linear scale",
                    [("ray.tune.qloguniform(5e-4, 6e-3, 1e-4)", "ray.tune.uniform(5e-4, 6e-3)")],
                    2, "lr is sampled by Uniform, not on a log scale", "by its order of magnitude"),
        WrongAnswer("a range without the recipe's", [("ray.tune.qloguniform(5e-4, 6e-3, 1e-4)",
                                                      "ray.tune.qloguniform(1e-5, 1e-3, 1e-5)")],
                    2, "lr's range [1e-05, 0.001] leaves out the recipe's 0.002", "holds the recipe's value"),
        WrongAnswer("no callback to Tune", [
            (",\n                             # Every ray.train.report also reaches Tune (and ASHA):\n"
             "                             callbacks=[TuneReportCallback()]", "")],
                    3, "Tune saw no result of any trial", "through a callback of the run"),
        WrongAnswer("no rung before the last epoch", [("grace_period=1", "grace_period=2")],
                    4, "ASHA compared the trials after epoch(s) 2 only, not after their first epoch",
                    "compares a trial with the others at its rungs"),
        WrongAnswer("ASHA not handed to Tune", [("search_alg=search, scheduler=asha)", "search_alg=search)")],
                    4, "no ASHA scheduler saw a result", "the scheduler its TuneConfig is given"),
        WrongAnswer("the metric minimised", [("metric=\"test_accuracy\", mode=\"max\"",
                                              "metric=\"test_accuracy\", mode=\"min\"")],
                    4, "go on, below the median", "test_accuracy is maximised"),
        WrongAnswer("ASHA told to minimise", [
            ("                         stop_last_trials=False)",
             "                         metric=\"test_accuracy\", mode=\"min\", stop_last_trials=False)"),
            ("TuneConfig(metric=\"test_accuracy\", mode=\"max\", num_samples", "TuneConfig(num_samples")],
                    4, "go on, below the median", "test_accuracy is maximised"),
        WrongAnswer("ASHA's default reduction factor", [("grace_period=1, reduction_factor=2,", "grace_period=1,")],
                    4, "with a cutoff of", "reduction_factor=2 makes it their median"),
        WrongAnswer("max_t of one epoch", [("max_t=args.epochs", "max_t=1")],
                    5, "ASHA's max_t is 1, not the run's 2 epochs: it compared the trials after epoch(s) 1 only",
                    "max_t is where ASHA ends the trials it keeps"),
    ],
    "06": [
        WrongAnswer("a function with the model cached per process", [
            ("def classify_batch(",
             "MODELS = {}  # preset -> model, built once in each process\n\n\ndef classify_batch("),
            ("    model = build_model(preset)\n    model.load_state_dict(ray.get(weights_ref))\n",
             "    if preset not in MODELS:\n        MODELS[preset] = build_model(preset)\n"
             "        MODELS[preset].load_state_dict(ray.get(weights_ref))\n    model = MODELS[preset]\n")],
                    1, "process(es) that are not actors (Ray tasks)", "given a function, it runs tasks",
                    of_the_starting_file=True),
        WrongAnswer("a pool of 1", [("ActorPoolStrategy(size=2)", "ActorPoolStrategy(size=1)")],
                    1, "the model ran in 1 actor(s), not a pool of 2", "starts a pool of actors"),
        WrongAnswer("the model built per batch", [
            ("        self.device = torch.device(device)\n        self.model = build_model(preset)\n"
             "        self.model.load_state_dict(ray.get(weights_ref))\n        self.model.to(self.device).eval()\n",
             "        self.device, self.preset, self.weights_ref = torch.device(device), preset, weights_ref\n"),
            ("        images = torch.tensor(", "        self.model = build_model(self.preset)\n"
             "        self.model.load_state_dict(ray.get(self.weights_ref))\n"
             "        self.model.to(self.device).eval()\n        images = torch.tensor(")],
                    2, "the model was built ", "build the model in the constructor", imported_otherwise=True),
        WrongAnswer("the ids dropped", [("return dict(batch, predicted=", "return dict(predicted=")],
                    3, "no id and label say which image", "keep its input columns"),
        WrongAnswer("no mirror image", [
            ("from common.training import predict",
             "from common.data import normalize\nfrom common.training import predict"),
            ("predict(self.model, images).max(1)", "self.model(normalize(images)).softmax(1).max(1)")],
                    3, "predictions or probabilities differ from the step script's", "its mirror image"),
        WrongAnswer("the weights never loaded", [("        self.model.load_state_dict(ray.get(weights_ref))\n", "")],
                    3, "predictions or probabilities differ from the step script's", "the weights handed in"),
    ],
    "04": [
        WrongAnswer("the root left out", [("    fully_shard(model, mesh=mesh, reshard_after_forward=False)\n", "")],
                    1, "of them whole, not sharded", "a module never given to it stays whole"),
        WrongAnswer("the root alone", [("    for module in model.modules():\n        if isinstance(module, "
                                        "TRANSFORMER_BLOCK):\n            fully_shard(module, mesh=mesh)\n", "")],
                    3, "1 all-gathers per step; 6 blocks and the root make 13", "each fully_shard call makes a unit"),
        WrongAnswer("the encoder one unit", [("    for module in model.modules():\n        if isinstance(module, "
                                              "TRANSFORMER_BLOCK):\n            fully_shard(module, mesh=mesh)\n",
                                              "    fully_shard(model.encoder, mesh=mesh)\n")],
                    3, "3 all-gathers per step; 6 blocks and the root make 13", "each fully_shard call makes a unit"),
        WrongAnswer("the blocks kept gathered", [
            ("fully_shard(module, mesh=mesh)", "fully_shard(module, mesh=mesh, reshard_after_forward=False)")],
                    3, "7 all-gathers per step: the blocks kept their gathered weights",
                    "every block is whole at once"),
        WrongAnswer("the root resharded", [("fully_shard(model, mesh=mesh, reshard_after_forward=False)",
                                            "fully_shard(model, mesh=mesh, reshard_after_forward=True)")],
                    3, "14 all-gathers per step: the root freed its weights", "backward starts at the root"),
    ],
    "04-accumulate": [
        WrongAnswer("a reduce-scatter per micro-batch",
                    [("        model.set_requires_gradient_sync(last_micro_batch)\n", "")],
                    2, "14 reduce-scatters per optimizer step", "only the last micro-batch's needs it"),
        WrongAnswer("the sync never back on",
                    [("set_requires_gradient_sync(last_micro_batch)", "set_requires_gradient_sync(False)")],
                    1, "step 1: the gradients are 100.0% away from 1 process's", "in the last micro-batch's backward"),
        WrongAnswer("the sync in the first micro-batch", [
            ("set_requires_gradient_sync(last_micro_batch)",
             "set_requires_gradient_sync(i % args.grad_accum_steps == 0)")],
                    1, "step 1: the gradients are", "in the last micro-batch's backward"),
        WrongAnswer("the loss not divided", [(" / args.grad_accum_steps\n", "\n")],
                    1, "step 1: the gradients are 2.00 times 1 process's", "divided by the number of micro-batches"),
        WrongAnswer("the loss divided twice", [("losses.append(loss_sum.item() / world_size)",
                                                "losses.append(loss_sum.item() / world_size / args.grad_accum_steps)")],
                    3, "step 1: 2 ranks reported train loss", "the sum of its micro-batches' shares"),
        WrongAnswer("a step every micro-batch", [("        if not last_micro_batch:\n            continue\n", "")],
                    1, "8 optimizer steps for 4 batches of 2 micro-batches", "after its last micro-batch's backward"),
    ],
    "07": [
        WrongAnswer("row-wise then column-wise", [('"mlp.0": ColwiseParallel()', '"mlp.0": RowwiseParallel()'),
                                                  ('"mlp.3": RowwiseParallel()', '"mlp.3": ColwiseParallel()')],
                    1, "mlp.0 is split by its inputs (row-wise), not by its outputs (column-wise)",
                    "the first layer of each pair is column-wise"),
        WrongAnswer("column-wise everywhere", [
            ('"self_attention.out_proj": RowwiseParallel()', '"self_attention.out_proj": ColwiseParallel()'),
            ('"mlp.3": RowwiseParallel()', '"mlp.3": ColwiseParallel()')],
                    1, "self_attention.out_proj is split by its outputs (column-wise), not by its inputs (row-wise)",
                    "the second is row-wise"),
        WrongAnswer("out_proj left out", [
            ('    "self_attention.out_proj": RowwiseParallel(),  # ... and projects them: an all-reduce sums\n', "")],
                    1, "self_attention.out_proj's weight is whole on every rank", "a layer left out stays whole"),
        WrongAnswer("the MLP alone", [
            ('    "self_attention.q": ColwiseParallel(),  # q, k and v: each rank computes its heads\' ...\n'
             '    "self_attention.k": ColwiseParallel(),\n    "self_attention.v": ColwiseParallel(),\n'
             '    "self_attention.out_proj": RowwiseParallel(),  # ... and projects them: an all-reduce sums\n', "")],
                    1, "self_attention.q's weight is whole on every rank", "a layer left out stays whole"),
        WrongAnswer("the first block alone", [(
            "    for module in model.modules():\n        if isinstance(module, TRANSFORMER_BLOCK):\n"
            "            parallelize_module(module, mesh, TP_PLAN)\n",
            "    parallelize_module(model.encoder.layers[0], mesh, TP_PLAN)\n")],
                    1, "block 1 of 6 is whole on every rank, block 0 is split", "each block needs it"),
        WrongAnswer("the later blocks alone", [(  # the check reads every block, not the first alone
            "    for module in model.modules():\n        if isinstance(module, TRANSFORMER_BLOCK):\n"
            "            parallelize_module(module, mesh, TP_PLAN)\n",
            "    for block in list(model.encoder.layers)[1:]:\n        parallelize_module(block, mesh, TP_PLAN)\n")],
                    1, "block 0 of 6 is whole on every rank, block 1 is split", "each block needs it"),
        WrongAnswer("q, k and v handing on DTensors", [  # PyTorch's TP tutorial's plan, for an attention of its own
            ('"self_attention.q": ColwiseParallel()', '"self_attention.q": ColwiseParallel(use_local_output=False)'),
            ('"self_attention.k": ColwiseParallel()', '"self_attention.k": ColwiseParallel(use_local_output=False)'),
            ('"self_attention.v": ColwiseParallel()', '"self_attention.v": ColwiseParallel(use_local_output=False)')],
                    2, "the run did not finish", "infers its heads from the width it is handed"),
        WrongAnswer("the partial sums never added", [
            ("from torch.distributed.device_mesh import init_device_mesh\n",
             "from torch.distributed.device_mesh import init_device_mesh\n"
             "from torch.distributed.tensor import Partial\n"),
            ('"mlp.3": RowwiseParallel()', '"mlp.3": RowwiseParallel(output_layouts=Partial())')],
                    2, "step 1: the 2 ranks' gradients differ", "a row-wise layer's output on each rank is a partial "
                                                                   "sum"),
        WrongAnswer("the output left split by tokens", [
            ("from torch.distributed.device_mesh import init_device_mesh\n",
             "from torch.distributed.device_mesh import init_device_mesh\n"
             "from torch.distributed.tensor import Shard\n"),
            ('"mlp.3": RowwiseParallel()', '"mlp.3": RowwiseParallel(output_layouts=Shard(1))')],
                    2, "the run did not finish", "hands on the whole output"),
    ],
    "hang-rank0": [
        WrongAnswer("the loss never reduced", [
            ("        dist.reduce(loss_sum, dst=0)  # a collective: every rank calls it, rank 0 alone receives the "
             "sum\n", "")],
                    3, "epoch 1: rank 0 logged train loss", "every rank calls the collective that sums it"),
        WrongAnswer("a barrier on rank 1 while rank 0 reduces", [
            ("                                test_accuracy=correct / counted))\n",
             "                                test_accuracy=correct / counted))\n"
             "        else:\n            dist.barrier()  # while rank 0 logs\n")],
                    2, "the run hung", "the same collectives, in the same order", of_the_starting_file=True),
        WrongAnswer("the rank that never came, not the one that waits", [
            ('DIAGNOSIS = dict(rank=0,', 'DIAGNOSIS = dict(rank=1,')],
                    1, "DIAGNOSIS's rank is not where the untouched file waits", "shows the line it waits on"),
        WrongAnswer("the evaluation's reduce, which both ranks call", [
            ('line="dist.reduce(loss_sum, dst=0)")', 'line=66)')],
                    1, "DIAGNOSIS's line is not where the untouched file waits", "shows the line it waits on"),
    ],
    "hang-uneven": [
        WrongAnswer("every rank cut to the shorter shard", [
            ("        for images, labels, ids in map(train_set.__getitem__, "
             "mine.split(args.batch_size // world_size)):",
             "        steps = torch.tensor(len(mine) // (args.batch_size // world_size))\n"
             "        dist.all_reduce(steps, op=dist.ReduceOp.MIN)\n"
             "        batches = mine.split(args.batch_size // world_size)[:int(steps)]\n"
             "        for images, labels, ids in map(train_set.__getitem__, batches):")],
                    3, "rank 0 took 6 optimizer steps; 1 process takes 8", "splits every batch over the ranks",
                    of_the_starting_file=True),
        WrongAnswer("the extra step dropped on rank 0 only", [
            ("        loss_sum = torch.zeros((), device=device)\n",
             "        loss_sum = torch.zeros((), device=device)\n"
             "        if rank == 0:\n            mine = mine[:-(args.batch_size // world_size)]\n")],
                    2, "the run hung", "the same collectives, in the same order", of_the_starting_file=True),
        WrongAnswer("a barrier before the epoch's reduce", [
            ("        tally = evaluate(", "        dist.barrier()\n        tally = evaluate(")],
                    2, "the run hung", "the same collectives, in the same order", of_the_starting_file=True),
    ],
    "hang-shape": [
        WrongAnswer("the padding counted", [("(hits >= 0).sum().item()", "len(hits)")],
                    3, "epoch 1: rank 0 logged test accuracy", "padding that evens the ranks' shapes must not be"),
        WrongAnswer("both shards cut to the shorter", [
            ("    for batch in shard.split(EVAL_BATCH):",
             "    for batch in shard[:len(labels) // world_size].split(EVAL_BATCH):")],
                    3, "epoch 1: rank 0 logged test accuracy", "each counted once", of_the_starting_file=True),
        WrongAnswer("rank 0's own hits, nothing gathered", [
            ("        everyone = [torch.empty_like(mine) for _ in range(world_size)]\n"
             "        dist.all_gather(everyone, mine)\n        hits += everyone\n", "        hits.append(mine)\n")],
                    3, "epoch 1: rank 0 logged test accuracy", "every image's", of_the_starting_file=True),
    ],
}


@pytest.mark.parametrize("lab, wrong", [on_time(lab, wrong, run=early_lab_answers)
                                        for lab, answers in WRONG_ANSWERS.items() for wrong in answers],
                         ids=lambda value: value.name.replace(" ", "-") if isinstance(value, WrongAnswer) else value)
def test_a_wrong_answer_fails_its_check_with_the_concepts_hint(request, ran_early, tmp_path, lab, wrong):
    (tmp_path / LABS[lab].file).write_text(wrong_answer(lab, wrong))
    assert_fails_for_its_reason(lab, wrong, check(request, ran_early, lab, wrong.name, tmp_path / LABS[lab].file))


@dataclass
class RightAnswer:
    """A right answer written otherwise than the solution, as edits of the solution: a check must pass it (one that
    fails a right answer teaches something false). on_its_own_ray: its check starts its own Ray, as on an attendee's
    machine, not on the suite's shared cluster."""
    name: str
    edits: list[tuple[str, str]]
    on_its_own_ray: bool = False


RIGHT_ANSWERS = {
    "07": [
        # torchtitan's way: the attention's input laid out once, so q, k and v share one backward all-reduce
        RightAnswer("the attention's input prepared once", [
            ("from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module\n",
             "from torch.distributed.tensor import Replicate\nfrom torch.distributed.tensor.parallel import ("
             "ColwiseParallel, PrepareModuleInput, RowwiseParallel,\n    parallelize_module)\n"),
            ("TP_PLAN = {\n", 'TP_PLAN = {\n    "self_attention": PrepareModuleInput(\n'
                              "        input_layouts=(Replicate(), None, None),\n"
                              "        desired_input_layouts=(Replicate(), None, None), use_local_output=False),\n")]),
        RightAnswer("wildcard names over the whole model", [(  # parallelize_module matches each name's parts
            "    for module in model.modules():\n        if isinstance(module, TRANSFORMER_BLOCK):\n"
            "            parallelize_module(module, mesh, TP_PLAN)\n",
            '    parallelize_module(model, mesh, {f"encoder.layers.*.{name}": style\n'
            "                                     for name, style in TP_PLAN.items()})\n")]),
    ],
    "01": [
        RightAnswer("gradients averaged by hand, no DDP", [
            ("    model = DistributedDataParallel(model)\n", ""),
            ("            loss.backward()\n", "            loss.backward()\n            for p in model.parameters():\n"
                                               "                dist.all_reduce(p.grad)\n"
                                               "                p.grad /= world_size\n")]),
        RightAnswer("the loss divided before it is summed", [(
            "        dist.all_reduce(loss_sum)  # every rank's loss, not just rank 0's\n"
            "        train_loss = loss_sum.item() / steps_per_epoch / world_size\n",
            "        mean_loss = loss_sum / steps_per_epoch / world_size\n        dist.all_reduce(mean_loss)\n"
            "        train_loss = mean_loss.item()\n")]),
    ],
    "04": [
        RightAnswer("the blocks taken from the encoder's layers, the default mesh", [
            ("    for module in model.modules():\n        if isinstance(module, TRANSFORMER_BLOCK):\n"
             "            fully_shard(module, mesh=mesh)\n",
             "    for block in model.encoder.layers:\n        fully_shard(block)\n"),
            ("fully_shard(model, mesh=mesh, reshard_after_forward=False)",
             "fully_shard(model, reshard_after_forward=False)")]),
    ],
    "04-accumulate": [
        RightAnswer("the gradients zeroed after the optimizer step", [
            ("        if i % args.grad_accum_steps == 0:  # the first micro-batch of an optimizer step\n"
             "            optimizer.zero_grad(set_to_none=True)\n", ""),
            ("        optimizer.step()\n", "        optimizer.step()\n        optimizer.zero_grad()\n")]),
    ],
    "05": [
        # ASHA stops every trial at max_t too, often while its run is still ending: Ray 2.60 then keeps that run's
        # worker CPU reserved (05-ray-tune/README.md). On a Ray of 2 CPUs the last trial waited for one till the
        # check's deadline, whenever the machine was busy (2 of 2 runs beside two busy processes, AMD EPYC Zen 4,
        # 2026-12-04): the check's own Ray has a CPU per trial. On the suite's shared 2-CPU cluster it would wait.
        RightAnswer("ASHA with its default stop_last_trials", [(
            "reduction_factor=2,\n                         stop_last_trials=False)", "reduction_factor=2)")],
            on_its_own_ray=True),
    ],
    "06": [
        RightAnswer("the pool as map_batches' concurrency, no_grad", [
            ("compute=ray.data.ActorPoolStrategy(size=2)", "concurrency=2"),
            ("@torch.inference_mode()", "@torch.no_grad()")]),
    ],
    "hang-rank0": [
        RightAnswer("the loss all-reduced", [(
            "        dist.reduce(loss_sum, dst=0)  # a collective: every rank calls it, rank 0 alone receives the "
            "sum\n",
            "        dist.all_reduce(loss_sum)\n")]),
        RightAnswer("the line as the untouched file numbers it, from its traceback", [
            ('line="dist.reduce(loss_sum, dst=0)")', 'line=68)')]),
        RightAnswer("the line as the file numbers it after a line added above it", [
            ('line="dist.reduce(loss_sum, dst=0)")', 'line=54)'),
            ("        dist.reduce(loss_sum, dst=0)  # a collective",
             "        # rank 1 never came here\n        dist.reduce(loss_sum, dst=0)  # a collective")]),
    ],
    "hang-shape": [
        RightAnswer("each rank's hits counted, the counts all-reduced", [(
            "    padded = torch.full((math.ceil(len(labels) / world_size),), -1)  # the longest shard's length, on "
            "every rank\n"
            "    padded[:len(shard)] = shard\n"
            "    hits = []\n"
            "    for batch in padded.split(EVAL_BATCH):  # the same shapes on every rank\n"
            "        mine = (predict(model, images[batch.clamp(min=0)]).argmax(1) == labels[batch.clamp(min=0)])"
            ".long()\n"
            "        mine[batch < 0] = -1  # padding: no image\n"
            "        everyone = [torch.empty_like(mine) for _ in range(world_size)]\n"
            "        dist.all_gather(everyone, mine)\n"
            "        hits += everyone\n"
            "    model.train()\n"
            "    hits = torch.cat(hits)\n"
            "    return (hits == 1).sum().item() / (hits >= 0).sum().item()\n",
            "    tally = torch.zeros(2, dtype=torch.long)  # [correct, counted] of this rank's shard\n"
            "    for batch in shard.split(EVAL_BATCH):\n"
            "        hits = predict(model, images[batch]).argmax(1) == labels[batch]\n"
            "        tally += torch.tensor([hits.sum().item(), len(batch)])\n"
            "    dist.all_reduce(tally)  # one tensor of one shape on every rank\n"
            "    model.train()\n"
            "    return tally[0].item() / tally[1].item()\n")]),
    ],
}


@pytest.mark.parametrize("lab, right", [on_time(lab, right, run=early_lab_answers)
                                        for lab, answers in RIGHT_ANSWERS.items() for right in answers],
                         ids=lambda value: value.name.replace(" ", "-") if isinstance(value, RightAnswer) else value)
def test_a_right_answer_written_otherwise_passes(request, ran_early, tmp_path, lab, right):
    (tmp_path / LABS[lab].file).write_text(edited(lab, right.edits))
    assert_passes(lab, check(request, ran_early, lab, right.name, tmp_path / LABS[lab].file))


def assert_fails_for_its_reason(lab: str, wrong: WrongAnswer, result: subprocess.CompletedProcess) -> None:
    lines = verdicts(result.stdout)
    assert result.returncode == 1 and len(lines) == len(STARTING_FAILURES[lab]), result.stdout + result.stderr[-3000:]
    failed, hint = lines[wrong.check - 1], hint_of(result.stdout, lines[wrong.check - 1])
    assert failed.startswith("FAIL") and wrong.failure in failed and wrong.hint in hint, result.stdout
    if wrong.imported_otherwise:
        assert all(line.startswith("PASS") for line in lines[:wrong.check - 1]), result.stdout


def assert_passes(lab: str, result: subprocess.CompletedProcess) -> None:
    lines = verdicts(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert len(lines) == len(STARTING_FAILURES[lab]) and all(line.startswith("PASS") for line in lines), result.stdout


def edited(lab: str, edits: list[tuple[str, str]], of_the_starting_file: bool = False) -> str:
    """The lab's solution (or starting file) with these edits made."""
    text = lab_file(lab, "labs" if of_the_starting_file else "labs/solutions").read_text()
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    return text


def wrong_answer(lab: str, wrong: WrongAnswer) -> str:
    """The text of a wrong answer: its edits made, and common's modules imported otherwise if it says so."""
    answer = edited(lab, wrong.edits, wrong.of_the_starting_file)
    if wrong.imported_otherwise:
        answer = imported_otherwise(answer)
        assert "shared_model.build_model(" in answer and "from common" not in answer
    return answer


def imported_otherwise(source: str) -> str:
    """The file with `import common.<module> as shared_<module>` in place of `from common.<module> import ...`, and
    its names used through it, so that a check that watched the names the lab imports would see none of the calls."""
    for line, module, names in re.findall(r"^(from common\.(\w+) import (.*))$", source, flags=re.MULTILINE):
        source = source.replace(line + "\n", "", 1)
        source = re.sub(r"^import torch$", f"import torch\nimport common.{module} as shared_{module}", source,
                        count=1, flags=re.MULTILINE)
        words = [name.strip() for name in names.split("#")[0].split(",")]
        source = re.sub(rf"(?<![.\w])({'|'.join(words)})\b", rf"shared_{module}.\1", source)
    return source


# The labs compared with the recipe in one process within labs.reference.TOLERANCE.
WITHIN_TOLERANCE = ("01", "04", "04-accumulate", "07", "hang-rank0", "hang-uneven", "hang-shape")

# The kernels of the oldest processor this machine can mimic (processes.lower_capabilities: ATen's lowest, with MKL's
# and oneDNN's code paths held to it), as test_step01.py's DDP test holds them: the scalar code, no FMA, rounds
# furthest from this machine's. Measured on lab 01's solution (Intel Xeon family 6 model 167, AVX-512, 2026-12-07), the
# largest relative difference from the recipe was 7.3e-14 with this machine's kernels, 6.1e-14 with AVX2's, 9.3e-14
# with DEFAULT's: a tolerance tuned just above this machine's passes AVX2's and fails DEFAULT's. The checks compare in
# float64 (labs.reference.TOLERANCE, 1e-6): each capability in between ran these tests once more for no other proof
# (173 s of the 618 these tests took on an Intel Xeon family 6 model 207, tests/history/account/before.json).
OTHER_KERNELS = (processes.lower_capabilities() or [None])[0]


@pytest.fixture(scope="module")
def other_kernels(tmp_path_factory) -> dict:
    """The environment that holds a process to OTHER_KERNELS (processes.kernels: checked once), with the folder of the
    reference runs made with them, which the labs run with them share: skipped, saying why, on a processor with no
    lower capability to hold (x86 machines all have one)."""
    if OTHER_KERNELS is None:
        pytest.skip("this processor offers no kernels below its own to run the labs with")
    return {**processes.kernels(OTHER_KERNELS), "LABS_CACHE": str(tmp_path_factory.mktemp("labs-cache-other-kernels"))}


@pytest.fixture(scope="module")
def kernels_server(other_kernels) -> processes.Preloaded:
    """python -m labs.check with OTHER_KERNELS, forked from a server that imported torch with them (it starts at its
    first run, in that run's environment: hold_kernels'), not a new interpreter per check (the 10 tests: 292 busy
    core-s, then 210, tests/history/account/README.md's "Cuts")."""
    server = check_server(WITHIN_TOLERANCE)
    yield server
    server.close()


def hold_kernels(monkeypatch, other_kernels: dict) -> None:
    """The processes this test starts compute with OTHER_KERNELS, and share its reference runs."""
    for key, value in other_kernels.items():
        monkeypatch.setenv(key, value)


@pytest.mark.parametrize("lab", WITHIN_TOLERANCE)
def test_a_solution_passes_with_another_processors_kernels(monkeypatch, other_kernels, kernels_server, lab):
    """A lab compared within a tolerance, run with OTHER_KERNELS, the recipe's reference run made with them too (the
    images' float32 arithmetic changes with them): its solution passes. Its wrong answers differ from the recipe by
    far more than rounding (a factor, another batch, a missing average; at least 60% of a step's gradients, 3e-3 of a
    loss or one test image of 255 on an Intel Xeon, 2026-12-03): those that a compared check catches fail it there
    too (the test below)."""
    hold_kernels(monkeypatch, other_kernels)
    assert_passes(lab, run_check(lab, lab_file(lab, "labs/solutions"), None, kernels_server.run))


# Wrong answers that a check comparing with the recipe (within labs.reference.TOLERANCE) catches, by their
# difference from it, which another processor's rounding must neither hide nor mimic: one from each family of
# compared checks (DDP's, FSDP2's accumulation, the clinic's), the quickest, with OTHER_KERNELS (38 to 61 s each with
# the DEFAULT kernels; all 14 such wrong answers passed so in 857 s on an Intel Xeon, 2026-12-03).
COMPARED_WRONG = {"01": "gradients summed by hand", "04-accumulate": "the loss not divided",
                  "hang-uneven": "every rank cut to the shorter shard"}


@pytest.mark.parametrize("lab, wrong", [(lab, wrong) for lab, name in COMPARED_WRONG.items()
                                        for wrong in WRONG_ANSWERS[lab] if wrong.name == name],
                         ids=lambda value: value.name.replace(" ", "-") if isinstance(value, WrongAnswer) else value)
def test_a_wrong_answer_fails_for_its_reason_with_another_processors_kernels(monkeypatch, other_kernels,
                                                                             kernels_server, tmp_path, lab, wrong):
    """A wrong answer caught by a compared check, with OTHER_KERNELS: it still fails that check with its hint, its
    failure neither hidden by another check's nor turned into a pass."""
    hold_kernels(monkeypatch, other_kernels)
    (tmp_path / LABS[lab].file).write_text(wrong_answer(lab, wrong))
    assert_fails_for_its_reason(lab, wrong, run_check(lab, tmp_path / LABS[lab].file, None, kernels_server.run))


@pytest.mark.parametrize("lab", [lab for lab in LABS if lab.startswith("hang-")])
def test_a_clinic_labs_truth_is_the_one_line_that_holds_its_collective(lab):
    """The check finds the line a diagnosis must name by its statement: one line of the starting file, which holds
    the collective (DDP's all-reduce runs in backward)."""
    checks = importlib.import_module(LABS[lab].checks)
    line, = clinic.lines_holding(lab_file(lab), checks.WAITS_AT)
    statement = lab_file(lab).read_text().splitlines()[line - 1].strip()
    assert statement.startswith(f"dist.{checks.TRUTH['collective']}(") or \
        (checks.TRUTH["collective"], statement) == ("all_reduce", "loss.backward()"), statement


@pytest.mark.parametrize("lab", [lab for lab in LABS if lab.startswith("hang-")])
def test_a_clinic_check_survives_a_line_added_above_its_collective(lab, tmp_path):
    """A line added above the collective in the lab's file (a maintainer's, or an attendee's print): the diagnosis is
    right with the line's new number or its statement, wrong with the number it had before."""
    checks = importlib.import_module(LABS[lab].checks)
    before, = clinic.lines_holding(lab_file(lab), checks.WAITS_AT)
    added = lab_file(lab).read_text().replace("\nimport ", "\n# a line added above\nimport ", 1)
    untouched = tmp_path / "untouched.py"
    untouched.write_text(added)
    diagnosed = tmp_path / LABS[lab].file
    for line, right in ((before + 1, True), (repr(checks.WAITS_AT), True), (before, False)):
        diagnosed.write_text(re.sub(r"DIAGNOSIS = dict\(.*\)", f"DIAGNOSIS = dict(rank={checks.TRUTH['rank']}, "
                                    f"collective={checks.TRUTH['collective']!r}, line={line})", added))
        outcome = clinic.diagnosis(diagnosed, checks.TRUTH, checks.WAITS_AT, untouched=untouched)
        assert (outcome.failure is None) == right, (line, outcome)


def hint_of(stdout: str, line: str) -> str:
    """The hint printed under a failed check's line."""
    after = stdout.split(line, 1)[1].lstrip("\n")
    return after.splitlines()[0] if after.startswith("      hint:") else ""


@pytest.mark.parametrize("lab", STEP_SCRIPTS)
def test_what_a_solution_adds_is_the_step_scripts_code(lab):
    added = statements(lab_file(lab, "labs/solutions")) - statements(lab_file(lab))
    assert added, "the solution adds nothing to the starting file"
    assert sorted(added - statements(ROOT / STEP_SCRIPTS[lab])) == sorted(UNLIKE_THE_SCRIPT.get(lab, ()))


def statements(path) -> set[str]:
    """A file's simple statements, one line each however they are wrapped, comments left out; not its docstrings,
    nor its imports (a lab imports from common/ what a script may hold itself)."""
    nodes = ast.walk(ast.parse(path.read_text()))
    return {ast.unparse(node) for node in nodes if isinstance(node, ast.stmt) and not hasattr(node, "body")
            and not isinstance(node, ast.Import | ast.ImportFrom)
            and not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))}



def test_lab06_solution_loads_the_model_as_the_step_script_does():
    """The actor's constructor is step 06's Classifier's, statement for statement; map_batches is given the class."""
    solution, script = (ast.parse(path.read_text()) for path in (lab_file("06", "labs/solutions"), ROOT / STEP_06))
    assert constructor(solution) == constructor(script) and len(constructor(script)) == 4
    calls = [node for node in ast.walk(solution) if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(
        "map_batches")]
    assert [ast.unparse(call.args[0]) for call in calls] == ["Classifier"]


def test_lab05_solution_schedules_and_searches_as_the_step_script_does():
    """ASHA with the script's arguments (its --grace-period's default is 1), over two of the script's knobs, each
    sampled as the script samples it (the TODO names the script's ranges)."""
    solution, script = (ast.parse(path.read_text()) for path in (lab_file("05", "labs/solutions"), ROOT / STEP_05))
    assert keywords(solution, "ASHAScheduler") == dict(keywords(script, "ASHAScheduler"), grace_period="1")
    ours, theirs = load_script("labs/solutions/05_tune.py").SEARCH_SPACE, load_script(STEP_05).SEARCH_SPACE
    assert set(ours) == {"lr", "weight_decay"} < set(theirs)
    assert all(sampled(ours[key]) == sampled(theirs[key]) for key in ours), {k: sampled(v) for k, v in ours.items()}
    assert "5e-4 to 6e-3" in lab_file("05").read_text() and "0.01 to 0.3" in lab_file("05").read_text()


def lab05_decisions(*trials) -> list:
    """ASHA's decisions on these trials' reports, each (metric at epoch 1, action there[, metric at epoch 2]), as the
    solution's ASHA makes them: rung 1, its cutoff the median of the first epochs before, max_t the run's 2."""
    from ray.tune.schedulers import TrialScheduler
    from statistics import median

    from labs.checks.tune import Decision
    decisions, before = [], []
    for i, (first, action, *second) in enumerate(trials):
        decisions.append(Decision(f"trial {i}", 1, first, getattr(TrialScheduler, action), 1,
                                  median(before) if before else None, 2))
        decisions += [Decision(f"trial {i}", 2, metric, TrialScheduler.STOP, 2, None, 2) for metric in second]
        before.append(first)
    return decisions


@pytest.mark.parametrize("trials, stops", [
    ([(0.3, "CONTINUE", 0.5)], False),                                     # the first trial, kept to the end
    ([(0.3, "CONTINUE", 0.5), (0.2, "STOP")], False),                      # below the median: stopped, rightly
    ([(0.3, "CONTINUE", 0.5), (0.4, "STOP")], True),                       # above it, stopped: a minimising ASHA
    ([(0.3, "CONTINUE", 0.5), (0.2, "CONTINUE", 0.4)], True),              # below it, kept
])
def test_lab05s_sweep_stops_once_its_ended_trials_fail_a_check_no_later_trial_can_pass(tmp_path, trials, stops):
    """Lab 05's check judges the trials that have ended: a decision of ASHA's that its median misjudges stays
    misjudged whatever the trials after it score, so the sweep stops there (a wrong answer's check takes 1 or 2 trials,
    not 3); decisions that the median agrees with never stop a sweep (the solution's check runs all 3)."""
    from labs.checks.tune import decided
    from labs.harness import lab_args
    assert decided(str(tmp_path), lab05_decisions(*trials), lab_args()) is stops


def test_lab05s_sweep_stops_when_its_first_trial_ends_with_no_decision_of_ashas():
    """A trial that ends with no ASHA decision (Tune saw none of its reports, or handed them to no ASHA: Tune's
    default FIFOScheduler's on_trial_complete tells) stops the sweep: the trials after it report through the same
    callbacks to the same scheduler. The schedulers are themselves again once the check is done."""
    from types import SimpleNamespace

    from ray.tune.schedulers import FIFOScheduler

    from labs.checks.tune import recording_decisions
    complete, stops = FIFOScheduler.on_trial_complete, []
    controller = SimpleNamespace(request_stop_experiment=lambda: stops.append("stopped"))
    with recording_decisions(2, lambda decisions: False) as decisions:
        FIFOScheduler().on_trial_complete(controller, SimpleNamespace(trial_id="run_trial_00000"), {})
    assert stops == ["stopped"] and decisions.stopped and FIFOScheduler.on_trial_complete is complete


def test_a_stopped_sweeps_checks_after_its_first_failure_say_they_were_not_run():
    from labs.checks.tune import CHECKS, STOPPED, stopped_at_first_failure
    from labs.outcome import Outcome
    outcomes = [Outcome(check, None if i != 3 else "misjudged", "") for i, check in enumerate(CHECKS)]
    assert [o.failure for o in stopped_at_first_failure(outcomes)] == [None, None, None, "misjudged", STOPPED, STOPPED]


def sampled(domain) -> tuple:
    """A Tune distribution's range and sampler: (lower, upper, LogUniform, q) for qloguniform."""
    sampler = domain.get_sampler()
    return domain.lower, domain.upper, type(getattr(sampler, "sampler", sampler)).__name__, getattr(sampler, "q", None)


def test_a_check_that_hangs_ends_at_its_deadline(request, tmp_path, monkeypatch):
    """A run that waits for something no timeout of its own covers (here, forever in the lab's code) ends at the
    check's deadline, with every check failed and the hang's hint: its command line, as an attendee runs it."""
    (tmp_path / "lab.py").write_text("import time\n\n\ndef classify(dataset, preset, weights_ref):\n"
                                     "    time.sleep(3600)\n")
    monkeypatch.setenv("LABS_DEADLINE_S", "20")
    start = time.monotonic()
    result = run_check("06", tmp_path / "lab.py", request.getfixturevalue("ray_cluster"))
    lines = verdicts(result.stdout)
    assert result.returncode == 1 and time.monotonic() - start < 90, result.stdout + result.stderr[-3000:]
    assert "the run hung: it did not end within the check's 20 s" in lines[0] and "py-spy dump" in result.stdout
    assert len(lines) == 3 and all(line.startswith("FAIL") for line in lines)


def keywords(module: ast.Module, function: str) -> dict[str, str]:
    """The keyword arguments of the one call of function in module."""
    [call] = [n for n in ast.walk(module) if isinstance(n, ast.Call) and ast.unparse(n.func) == function]
    return {keyword.arg: ast.unparse(keyword.value) for keyword in call.keywords}


def constructor(module: ast.Module) -> list[str]:
    """The statements of Classifier.__init__, without its docstring and comments."""
    classifier = next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "Classifier")
    init = next(n for n in classifier.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    return [ast.unparse(statement) for statement in init.body]


def test_lab04_solution_shards_as_the_step_script_does(gloo_group_of_one):
    """The same units, each freeing or keeping its gathered weights after forward, as step 04's shard_model."""
    solution, script = load_script("labs/solutions/04_fully_shard.py"), load_script(RAY_FSDP2)
    flags = argparse.Namespace(mixed_precision=False, cpu_offload=False, reshard_after_forward=True,
                               activation_checkpointing=False)
    units = fsdp_units(lambda model: solution.shard_model(model, gloo_group_of_one))
    assert units == fsdp_units(lambda model: script.shard_model(model, flags, torch.device("cpu")))
    assert len(units) == 7 and [reshards for _, reshards in units] == [False] + [True] * 6


def fsdp_units(shard_model) -> list[tuple[str, bool]]:
    """The units shard_model makes of the tiny model: each one's name, and whether it reshards after forward."""
    model = build_model("tiny")
    shard_model(model)
    return [(name, module._get_fsdp_state()._fsdp_param_group.post_forward_mesh_info is not None)
            for name, module in model.named_modules() if isinstance(module, FSDPModule)]


def test_a_reference_run_is_kept_for_the_code_as_it_is(tmp_path, monkeypatch):
    """A check's reference run is read back while nothing it depends on changed: the attendee's lab file is no part
    of it. Changed code of common/, other lab flags, kernels held lower or another processor make a new run."""
    from labs import cache, harness

    for path in ("common/model.py", "labs/01_ddp.py"):
        (tmp_path / path).parent.mkdir(exist_ok=True)
        (tmp_path / path).write_text("# as shipped\n")
    monkeypatch.setattr(harness, "ROOT", tmp_path)
    monkeypatch.setattr(cache, "CACHE", tmp_path / "cache")
    assert cache.load_reference("recipe") is None
    assert cache.save_reference("recipe", {"loss": 1.5}) == {"loss": 1.5} == cache.load_reference("recipe")
    (tmp_path / "labs/01_ddp.py").write_text("# the attendee's try\n")
    assert cache.load_reference("recipe") == {"loss": 1.5}
    (tmp_path / "common/model.py").write_text("# a wider model\n")
    assert cache.load_reference("recipe") is None
    cache.save_reference("recipe", {"loss": 1.2})
    monkeypatch.setattr(harness, "LAB_FLAGS", [*harness.LAB_FLAGS, "--lr", "2e-3"])
    assert cache.load_reference("recipe") is None
    cache.save_reference("recipe", {"loss": 1.1})
    monkeypatch.setenv("MKL_CBWR", "AVX2")  # MKL's kernels as on an older processor: they round otherwise
    assert cache.load_reference("recipe") is None
    cache.save_reference("recipe", {"loss": 1.0})
    monkeypatch.setattr(cache, "processor", lambda: "another processor")
    assert cache.load_reference("recipe") is None


def test_a_failed_runs_reason_is_the_workers_own_exception_not_rays_shortened_message():
    """A state dict loaded into the wrong module raises a line, then one that lists every key; Ray's message cuts
    the traceback short, before that line when the paths are long (as in the suite). The check shows the worker's
    own exception. A run that hung shows the ranks that never joined; an error with no worker's, its last line."""
    from ray.train import WorkerGroupError

    from labs.ray_runs import ray_error

    raised = RuntimeError("Error(s) in loading state_dict for DistributedDataParallel:\n\tMissing key(s) in "
                          "state_dict: \"module.conv_proj.weight\", \"module.encoder.pos_embedding\".")
    shortened = ("[Rank 0,1 Error Snippet]:\nTraceback (most recent call last):\n  File \"/a/long/path/lab.py\"\n"
                 "... (Output truncated. See individual worker logs for full details) ...\n"
                 "coder.pos_embedding\".")
    assert ray_error(WorkerGroupError(shortened, {1: ValueError("x"), 0: raised})) == (
        "RuntimeError: Error(s) in loading state_dict for DistributedDataParallel:")
    hung = "RuntimeError: Timed out\nThe following ranks have not joined the collective operation: [1]\nSee the logs."
    assert ray_error(WorkerGroupError(hung, {0: RuntimeError("Timed out")})) == (
        "The following ranks have not joined the collective operation: [1]")
    assert ray_error(RuntimeError("the worker group died\nsee its logs")) == "see its logs"


def test_a_rendezvous_port_is_free_and_below_the_ports_that_connections_are_given(monkeypatch):
    """A lab's check once failed with EADDRINUSE: its MASTER_PORT, handed out by bind(0), had been given to another
    connection on the machine before rank 0 listened on it. A port in use is passed over. (Ray Train's local mode, the
    tests and the benchmarks take theirs here too.)"""
    from common import rendezvous

    sample = rendezvous.random.sample
    with socket.socket() as held:
        held.bind(("127.0.0.1", rendezvous.free_port()))
        taken = held.getsockname()[1]
        monkeypatch.setattr(rendezvous.random, "sample", lambda ports, k: [taken, *sample(ports, k - 1)])
        port = rendezvous.free_port()
    assert port != taken and 1024 < taken < 32768 and 1024 < port < 32768


def ranks_running(folder, rank0: str, rank1: str) -> list:
    """Two ranks started as labs/ranks.py starts a lab's, each running its line of Python (builtins.exec as the
    entry)."""
    from labs import ranks as lab_ranks

    source = f"import os\nif os.environ['RANK'] == '0':\n    {rank0}\nelse:\n    {rank1}\n"
    return lab_ranks.start_ranks("builtins:exec", source, 2, folder)


# gloo's abort; pytest's faulthandler, which a forked process inherits, would print every thread's stack.
ABORT = "import faulthandler; faulthandler.disable(); os.abort()"


@pytest.mark.parametrize("peer, says", [
    ("import time; time.sleep(1); raise RuntimeError('Connection reset by peer')",
     "RuntimeError: Connection reset by peer"),
    ("import time; time.sleep(3600)", "rank 0 ended with SIGABRT and no Python error")])
def test_a_rank_that_aborts_leaves_its_peer_time_to_say_why(tmp_path, monkeypatch, peer, says):
    """gloo aborts a rank on a size mismatch (hang-shape): no traceback of its own. Its peer, given a collective's
    timeout, says why it stops; one that says nothing leaves the abort named, never "the ranks timed out"."""
    from labs import ranks as lab_ranks

    monkeypatch.setattr(lab_ranks, "COLLECTIVE_TIMEOUT_S", 3)
    ranks = ranks_running(tmp_path, ABORT, peer)
    start = time.monotonic()
    with pytest.raises(lab_ranks.RunFailed, match=says):
        lab_ranks.results(ranks, tmp_path, timeout=60)
    assert time.monotonic() - start < 10


def test_a_rank_that_raised_ends_its_waiting_peer_at_once(tmp_path, monkeypatch):
    """A rank's Python error already says why the run stopped: its peer, waiting in a collective, is ended at once,
    not given a collective's timeout (each check of a wrong answer that hangs would wait that much longer)."""
    from labs import ranks as lab_ranks

    monkeypatch.setattr(lab_ranks, "COLLECTIVE_TIMEOUT_S", 60)
    ranks = ranks_running(tmp_path, "raise ValueError('x')", "import time; time.sleep(3600)")
    start = time.monotonic()
    with pytest.raises(lab_ranks.RunFailed, match="ValueError: x"):
        lab_ranks.results(ranks, tmp_path, timeout=120)
    assert time.monotonic() - start < 10


def test_a_run_that_hung_is_told_by_the_rank_that_timed_out_not_by_the_peer_it_left(tmp_path):
    """The rank whose collective timed out exits; its peer then reads "Connection closed by peer" and, if it writes
    that before it is killed, both errors are there (hang-uneven failed CI so): the timeout is the run's cause."""
    from labs import ranks as lab_ranks

    ranks = ranks_running(tmp_path, "raise RuntimeError('Connection closed by peer [127.0.0.1]:1')",
                          "raise RuntimeError('Timed out waiting 10000ms for recv operation to complete')")
    for rank in ranks:
        rank.join(timeout=60)
    with pytest.raises(lab_ranks.RunFailed, match="RuntimeError: Timed out waiting"):
        lab_ranks.results(ranks, tmp_path, timeout=60)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_labs_ranks_start_with_torchruns_environment_forked_or_not(tmp_path, monkeypatch, method):
    """Ranks are forked on Linux (START_RANK) and started as new interpreters elsewhere: either way each gets its
    own RANK of the WORLD_SIZE, and what its entry returned comes back in rank order."""
    from labs import ranks as lab_ranks

    monkeypatch.setattr(lab_ranks, "START_RANK", multiprocessing.get_context(method))
    ranks = lab_ranks.start_ranks("os:getenv", "RANK", 2, tmp_path)  # each rank returns os.getenv("RANK")
    assert lab_ranks.results(ranks, tmp_path, timeout=60) == ["0", "1"]


def test_a_labs_ray_job_imports_this_repository_then_the_path_its_check_was_given(monkeypatch):
    """The job's PYTHONPATH, which Ray would otherwise replace: the suite's startup/ folder (conftest.py) stays."""
    import ray

    from labs.harness import ROOT
    from labs.ray_runs import start_ray

    given = {}
    monkeypatch.setattr(os, "environ", {**os.environ, "PYTHONPATH": "/some/where"})  # what start_ray sets stays here
    monkeypatch.setattr(ray, "init", lambda **options: given.update(options))
    start_ray("local")
    assert given["runtime_env"]["env_vars"]["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/some/where"]
