"""Every flag of every step is checked as soon as it is parsed: a bad value ends the run before any work,
with one line on stderr that names the flag, the value and the fix, and exit code 2 (argparse's)."""
import threading
import time

import pytest

from common import errors
from common import flags as flags_module
from common.flags import add_ray_flags, make_parser, worker_count
from conftest import parse_only

SCRIPTS = ["01-vanilla-pytorch-ddp/train_single_machine.py", "01-vanilla-pytorch-ddp/train_ddp.py",
           "02-ray-train-ddp/train_ray_ddp.py", "02-ray-train-ddp/train_ray_ddp_with_ray_data.py",
           "03-ray-train-fsdp/train_ray_fsdp.py", "04-ray-train-fsdp2/train_ray_fsdp2.py",
           "05-ray-tune/tune_ray_ddp.py", "07-tensor-parallel/train_ray_tp.py"]
RAY_SCRIPTS = SCRIPTS[2:]

# (flags, the one line expected on stderr); {file} is a regular file, so nothing can be created under it.
EVERY_STEP = [
    *[([flag, value], f"error: {flag} {value} must be at least 1") for flag, value in [
        ("--epochs", "0"), ("--batch-size", "0"), ("--steps-per-epoch", "-3"), ("--eval-images", "0"),
        ("--grad-accum-steps", "0")]],
    *[([flag, value], f"error: {flag} {value} must be a finite number") for flag, value in [
        ("--lr", "nan"), ("--lr", "inf"), ("--weight-decay", "inf"), ("--weight-decay", "nan"),
        ("--warmup-epochs", "nan"), ("--label-smoothing", "inf")]],
    *[([flag, value], f"error: {flag} {shown} must be 0 or more") for flag, value, shown in [  # shown as parsed
        ("--warmup-epochs", "-1", "-1.0"), ("--weight-decay", "-1", "-1.0"), ("--profile-steps", "-1", "-1"),
        ("--seed", "-1", "-1")]],
    (["--lr", "-0.1"], "error: --lr -0.1 must be greater than 0 (the recipe's is 2e-3)"),
    (["--label-smoothing", "-0.1"],
     "error: --label-smoothing -0.1 must be at least 0 and below 1 (the recipe's is 0.1)"),
    (["--steps-per-epoch", "6", "--profile-steps", "5"],
     "error: --profile-steps 5 and 2 warm-up steps do not fit in an epoch of 6 steps; use at most 4"),
    (["--label-smoothing", "1"], "error: --label-smoothing 1.0 must be at least 0 and below 1 (the recipe's is 0.1)"),
    (["--epochs", "2", "--warmup-epochs", "3"], "error: --warmup-epochs 3.0 is longer than --epochs 2; use at most 2"),
    (["--epochs", "2", "--fail-at-epoch", "3"], "error: --fail-at-epoch 3 must be between 1 and --epochs 2"),
    (["--epochs", "2", "--fail-at-epoch", "0"], "error: --fail-at-epoch 0 must be between 1 and --epochs 2"),
    (["--data", "synthetic", "--eval-images", "5000"],
     "error: --eval-images 5000 is more than the 1,024 evaluation images of --data synthetic"),
    (["--data", "synthetic", "--batch-size", "8192"],
     "error: --batch-size 8192 is larger than the 4,096 training images; use at most that"),
    (["--checkpoint-dir", "{file}/checkpoints"],
     "error: --checkpoint-dir {file}/checkpoints cannot be created or written; pass a writable folder"),
    (["--data", "cifar10", "--data-dir", "{file}/cifar10"], "error: --data-dir {file}/cifar10 has no CIFAR-10 cache "
     "and cannot be created to download one; pass a writable folder"),
    (["--model", "enormous"], "error: argument --model: invalid choice: 'enormous' (choose from 'tiny', 'hybrid', "
     "'small', 'base', 'large', 'huge', 'giant')"),
]
STEP_01 = [
    (["--batch-size", "32", "--grad-accum-steps", "3"],
     "error: --batch-size 32 does not split evenly over 1 process(es) x --grad-accum-steps 3; use a multiple of 3"),
]
RAY_ONLY = [
    (["--num-workers", "2", "--batch-size", "32", "--grad-accum-steps", "3"],
     "error: --batch-size 32 does not split evenly over 2 process(es) x --grad-accum-steps 3; use a multiple of 6"),
    (["--max-failures", "-1"], "error: --max-failures -1 must be 0 or more"),
    (["--num-workers", "3", "--batch-size", "32"],
     "error: --batch-size 32 does not split evenly over 3 processes; use a multiple of 3"),
]
# Step 04's --num-workers MIN-MAX (elastic training): the global batch must split at every size in the range.
ELASTIC = "04-ray-train-fsdp2/train_ray_fsdp2.py"
ELASTIC_ONLY = [
    (["--batch-size", "32", "--num-workers", "1-3"], "error: --batch-size 32 does not split evenly over 3 processes, "
     "one of the sizes of --num-workers 1-3; use a multiple of 6"),
    (["--batch-size", "32", "--num-workers", "1-2", "--grad-accum-steps", "3"], "error: --batch-size 32 does not "
     "split evenly over 1 process(es) x --grad-accum-steps 3, one of the sizes of --num-workers 1-2; use a multiple "
     "of 6"),
    (["--num-workers", "0-2"], "error: --num-workers 0-2 must start at 1 or more (0 is local mode, not part of a "
     "range)"),
    (["--num-workers", "2-1"], "error: --num-workers 2-1 must name the smaller number first: 1-2"),
    (["--num-workers", "two"], "error: argument --num-workers: 'two' is not a number of workers; use N, or MIN-MAX "
     "(elastic)"),
]
# The other Ray steps take one number, as before.
NOT_ELASTIC = [(["--num-workers", "1-2"], "error: argument --num-workers: invalid int value: '1-2'")]
# Step 05's own flags: a sweep never tunes on the test set.
SWEEP_ONLY = [
    (["--data", "cifar10"], "error: --data cifar10 would tune on the test set, which would then no longer measure "
     "anything; tune on --data cifar10-val (the last 5,000 training images, held out)"),
    (["--num-samples", "0"], "error: --num-samples 0 must be at least 1"),
    (["--epochs", "2", "--grace-period", "3"], "error: --grace-period 3 must be between 1 and --epochs 2"),
    (["--epochs", "2", "--grace-period", "0"], "error: --grace-period 0 must be between 1 and --epochs 2"),
    (["--checkpoint-dir", "s3://bucket/runs"], "error: --checkpoint-dir s3://bucket/runs must be a local or mounted "
     "folder: each trial notes its placement groups there for the sweep to read"),
]
# Step 07's --tp: whole TP groups, each splitting the heads and MLP units evenly; the batch splits over dp groups.
TP = "07-tensor-parallel/train_ray_tp.py"
TP_ONLY = [
    (["--tp", "0"], "error: --tp 0 must be at least 1"),
    (["--num-workers", "2", "--tp", "3"], "error: --tp 3 does not divide --num-workers 2 into whole TP groups; use a "
     "divisor of 2"),
    (["--num-workers", "4", "--tp", "4", "--model", "hybrid"], "error: --tp 4 does not split --model hybrid's 6 "
     "attention heads evenly; use a divisor of 6"),
    (["--num-workers", "0", "--tp", "2"], "error: --tp 2 does not divide local mode's 1 process into whole TP groups; "
     "use a divisor of 1"),
    (["--num-workers", "6", "--tp", "2", "--batch-size", "32"], "error: --batch-size 32 does not split evenly over 3 "
     "processes; use a multiple of 3"),
]
# Step 06 (inference) shares the data flags; every case names a checkpoint, which is looked for after the flags.
INFERENCE = "06-ray-data-inference/batch_inference.py"
INFERENCE_CASES = [
    (["--actors", "0"], "error: --actors 0 must be at least 1"),
    (["--batch-size", "0"], "error: --batch-size 0 must be at least 1"),
    *[case for case in EVERY_STEP if case[0][-2] in ("--eval-images", "--data-dir", "--model")],
]
# --num-workers 0 is Ray Train's local mode in steps 02 to 04; the Ray Data variant and the sweep need Ray.
LOCAL_MODE_SCRIPTS = RAY_SCRIPTS[0:1] + RAY_SCRIPTS[2:4] + [TP]
NEED_RAY = [(["--num-workers", "0"], "error: --num-workers 0 must be at least 1"),
            (["--num-workers", "-1"], "error: --num-workers -1 must be at least 1")]
LOCAL_MODE = [
    (["--num-workers", "-1"], "error: --num-workers -1 must be 0 (Ray Train's local mode) or more"),
    (["--num-workers", "0", "--resume"], "error: --num-workers 0 is Ray Train's local mode, which keeps no "
     "checkpoints; drop --resume and --fail-at-epoch, or use --num-workers 1 or more"),
    (["--num-workers", "0", "--epochs", "2", "--fail-at-epoch", "1"], "error: --num-workers 0 is Ray Train's local "
     "mode, which keeps no checkpoints; drop --resume and --fail-at-epoch, or use --num-workers 1 or more"),
]
# The cases every step shares run once each, on the scripts in turn (all of them see some): each script parses its
# flags with make_parser's parser and check_flags (add_ray_flags's too, for the Ray steps), which
# test_every_script_parses_and_checks_the_shared_flags_as_make_parser_does proves, so every case's answer is the same on
# every script. What a script adds or changes (local mode, elastic ranges, the sweep's and step 06's own flags) runs on
# each script it concerns.
SHARED_BY = [(EVERY_STEP, SCRIPTS), (STEP_01, SCRIPTS[:2]), (RAY_ONLY, RAY_SCRIPTS)]  # cases, the scripts they concern
SHARED = [(scripts[i % len(scripts)], *case) for cases, scripts in SHARED_BY for i, case in enumerate(cases)]
CASES = SHARED + [
    (script, *case) for script in RAY_SCRIPTS if script not in LOCAL_MODE_SCRIPTS for case in NEED_RAY] + [
    (script, *case) for script in LOCAL_MODE_SCRIPTS for case in LOCAL_MODE] + [
    (ELASTIC, *case) for case in ELASTIC_ONLY] + [
    (script, *case) for script in RAY_SCRIPTS if script != ELASTIC for case in NOT_ELASTIC] + [
    ("05-ray-tune/tune_ray_ddp.py", *case) for case in SWEEP_ONLY] + [
    (TP, *case) for case in TP_ONLY] + [
    (INFERENCE, ["--checkpoint", "nowhere", *flags], message) for flags, message in INFERENCE_CASES]


@pytest.mark.parametrize("script, flags, message", CASES,
                         ids=[f"{s.split('/')[-1]}:{' '.join(f)}" for s, f, _ in CASES])
def test_a_bad_flag_is_one_line_and_exit_code_2_before_any_work(script, flags, message, tmp_path, run_main):
    file = tmp_path / "a-file"
    file.write_text("")
    flags = [f.replace("{file}", str(file)) for f in flags]
    code, stderr = run_main(script, *flags)
    assert (code, stderr) == (2, [message.replace("{file}", str(file))])


def script_parser(script):
    """The parser a script's main() builds, with every flag it defines (main() stops once it has parsed)."""
    flags = ["--checkpoint", "nowhere"] if script == INFERENCE else []
    parser, _ = parse_only(script, *flags, check=False)
    return parser


def flag_definitions(parser) -> dict:
    """Each flag's definition: what argparse does with it, and its default."""
    return {action.option_strings[-1]: (type(action), action.dest, action.nargs, action.const, action.type,
                                        action.choices, action.required, action.default)
            for action in parser._actions if action.option_strings and action.dest != "help"}


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_parses_and_checks_the_shared_flags_as_make_parser_does(script):
    """The cases above that every step shares run on one script each: this is why each would give the same answer on
    every other. A script's parser is make_parser's (and add_ray_flags's, as the script calls it): the same flags,
    parsed alike, with the same defaults (but the folder each step writes to, and the data step 05 tunes on, which
    SWEEP_ONLY checks), checked by check_flags."""
    parser = script_parser(script)
    expected = make_parser("", "step")
    if script in RAY_SCRIPTS:
        add_ray_flags(expected, local_mode=script in LOCAL_MODE_SCRIPTS, elastic=script == ELASTIC)
    assert parser.check is flags_module.check_flags and parser.local_mode == expected.local_mode
    shared, own = flag_definitions(expected), flag_definitions(parser)
    for flag, definition in shared.items():
        if flag == "--checkpoint-dir" or (flag == "--data" and script == "05-ray-tune/tune_ray_ddp.py"):
            definition, own[flag] = definition[:-1], own[flag][:-1]  # the default differs, by design
        assert own[flag] == definition, f"{script}: {flag}"


@pytest.mark.parametrize("script", [*SCRIPTS, INFERENCE])
def test_every_numeric_flag_has_a_case_below_its_lower_bound_and_every_float_flag_a_non_finite_one(script):
    """Checked against the flags each script really defines, so a new numeric flag needs its cases above: a shared
    case counts for every script it concerns (SHARED_BY)."""
    numeric = {action.option_strings[-1]: action.type for action in script_parser(script)._actions
               if action.type in (int, float)}
    assert {"--batch-size", "--eval-images"} <= set(numeric)
    values = {}  # flag: the values its cases give it, on this script
    shared = [flags for cases, scripts in SHARED_BY if script in scripts for flags, _ in cases]
    for flags in shared + [flags for case_script, flags, _ in CASES if case_script == script]:
        for flag, value in zip(flags, flags[1:], strict=False):
            values.setdefault(flag, []).append(value)
    for flag, kind in numeric.items():
        given = values.get(flag, [])
        assert any(float(value) <= 0 for value in given), f"{script}: no case below the lower bound of {flag}"
        if kind is float:
            assert {"nan", "inf"} & set(given), f"{script}: no non-finite case for {flag}"


def test_under_torchrun_only_rank_0_prints_the_error(run_main, monkeypatch):
    """Rank 1 waits before it exits: torchrun would otherwise stop rank 0 before it printed (a test run saw it).
    time.sleep is the whole process's: the early runs' thread (subprocess waits) goes on sleeping for real."""
    waits, real_sleep, this_thread = [], time.sleep, threading.get_ident()

    def sleep(seconds):
        waits.append(seconds) if threading.get_ident() == this_thread else real_sleep(seconds)

    monkeypatch.setattr(errors.time, "sleep", sleep)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert run_main(SCRIPTS[1], "--batch-size", "33") == (2, []) and waits == [errors.FIRST_PROCESS_GRACE_S]
    monkeypatch.setenv("RANK", "0")
    assert run_main(SCRIPTS[1], "--batch-size", "33") == (
        2, ["error: --batch-size 33 does not split evenly over 2 processes; use a multiple of 2"])
    assert waits == [errors.FIRST_PROCESS_GRACE_S]  # rank 0 speaks at once


def test_more_torchrun_processes_than_gpus_is_one_line_that_names_the_right_count(run_main, monkeypatch):
    """On a machine with one GPU, rank 1 would ask CUDA for a second GPU and fail with a CUDA error."""
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert run_main(SCRIPTS[1], "--epochs", "1") == (
        2, ["error: --nproc_per_node 2 is more than this node's 1 GPU(s), one process each; use --nproc_per_node 1"])


@pytest.mark.parametrize("script, flags", [(SCRIPTS[2], []), (SCRIPTS[4], ["--num-workers", "2"])])
def test_a_gpu_shortfall_names_no_gpu_as_a_way_out(script, flags, run_main, monkeypatch):
    """One GPU and 2 workers: the message offers CPU workers too (step 03 cannot take fewer than 2 workers)."""
    import ray

    from common import ray_setup

    monkeypatch.setattr(ray, "init", lambda **options: None)
    monkeypatch.setattr(ray_setup.ray, "cluster_resources", lambda: {"CPU": 16.0, "GPU": 1.0})
    code, stderr = run_main(script, "--data", "synthetic", *flags)
    assert code == "error: --num-workers 2 needs 2 GPUs, the cluster has 1; use --num-workers 1 or fewer, or " \
                   "--no-gpu to train on CPUs" and stderr == []


@pytest.mark.parametrize("flags, resources, message", [
    (["--num-workers", "2-4"], {"CPU": 1.0}, "error: --num-workers 2-4 needs 2 CPUs, the cluster has 1; use a MIN of "
                                             "1 or fewer"),
    (["--num-workers", "2-4"], {"CPU": 16.0, "GPU": 1.0}, "error: --num-workers 2-4 needs 2 GPUs, the cluster has 1; "
                                                          "use a MIN of 1 or fewer, or --no-gpu to train on CPUs"),
])
def test_an_elastic_range_needs_its_min_to_fit_the_cluster(flags, resources, message, run_main, monkeypatch):
    import ray

    from common import ray_setup

    monkeypatch.setattr(ray, "init", lambda **options: None)
    monkeypatch.setattr(ray_setup.ray, "cluster_resources", lambda: resources)
    monkeypatch.setenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "")  # restored after, as the run sets it
    monkeypatch.delenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S")
    assert run_main(ELASTIC, "--data", "synthetic", "--batch-size", "48", *flags) == (message, [])


@pytest.mark.parametrize("flag, cpu_each, accepted", [("--num-workers", False, True), ("--actors", True, False)])
def test_gpu_workers_are_counted_in_gpus_and_actors_in_both(flag, cpu_each, accepted, monkeypatch):
    """4 nodes of 8 GPUs and 1 CPU each, as ray.cluster_resources() reports them (SLURM gives a job the CPUs it asks
    for): 32 GPU workers fit, for Ray Train asks {"GPU": 1} alone for each; step 06's 32 actors ask a CPU each too,
    and are refused in one line."""
    import argparse

    from common import ray_setup

    monkeypatch.setattr(ray_setup.ray, "cluster_resources", lambda: {"CPU": 4.0, "GPU": 32.0, "memory": 1e12})
    args = argparse.Namespace(num_workers=32, actors=32, use_gpu=True)
    if accepted:
        assert ray_setup.check_cluster_and_choose_gpu(args, flag, cpu_each) is True
    else:
        with pytest.raises(SystemExit, match=r"^error: --actors 32 needs 32 CPUs, the cluster has 4; use --actors 4 "
                                             r"or fewer$"):
            ray_setup.check_cluster_and_choose_gpu(args, flag, cpu_each)


def test_an_elastic_range_starts_on_its_min_and_waits_less_for_a_lost_node(monkeypatch):
    """1-4 on a cluster of 1 CPU: accepted (Ray starts 1 worker, more as nodes join); its worker group's start
    timeout is shortened, so that the retry at the size last seen gives up soon after a node is lost."""
    import argparse

    from common import ray_setup

    monkeypatch.setattr(ray_setup.ray, "cluster_resources", lambda: {"CPU": 1.0})
    monkeypatch.setenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "")  # restored after, as the run sets it
    monkeypatch.delenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S")
    args = argparse.Namespace(num_workers=(1, 4), use_gpu=None)
    assert ray_setup.check_cluster_and_choose_gpu(args) is False
    assert float(ray_setup.os.environ["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"]) == ray_setup.ELASTIC_START_TIMEOUT_S
    assert [worker_count(text) for text in ("2", "1-4", "3-3")] == [2, (1, 4), 3]
