"""benchmarks/trace_analysis.py: the interval arithmetic and the reading of a trace, on hand-made traces; then the
traces that common/profiling.py writes in the scripts' own runs (step 01's torchrun DDP run and step 04's FSDP2 run,
the suite's shared runs), and PyTorch's DDP all-reducing in every backward but under no_sync() (upstream)."""
import argparse
import contextlib
import re
import runpy
import sys

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from common.flags import Parser
from common.profiling import StepProfiler, add_profile_flag, check_profile_flag
from checks import load_script, profile_summary
from conftest import ROOT

analysis = load_script("benchmarks/trace_analysis.py")
analyze_trace, collective_kind, intersection = analysis.analyze_trace, analysis.collective_kind, analysis.intersection
load_trace, total, union = analysis.load_trace, analysis.total, analysis.union

MAIN, GLOO_A, GLOO_B = 1, 2, 3  # thread ids: the training thread and two of gloo's
NEXT_BATCH = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
BACKWARD = "autograd::engine::evaluate_function: "


def event(name, start_ms, end_ms, thread=MAIN):
    return dict(ph="X", name=name, ts=start_ms * 1000, dur=(end_ms - start_ms) * 1000, tid=thread,
                pid=1, cat="cpu_op")


def test_union_merges_overlapping_nested_and_touching_intervals():
    assert union([(5, 6), (0, 2), (1, 3), (3, 4), (0.5, 1)]) == [(0, 4), (5, 6)]
    assert union([]) == []


def test_intersection_of_two_unions():
    a, b = [(0, 4), (6, 10)], [(1, 2), (3, 7), (9, 12)]
    assert intersection(a, b) == [(1, 2), (3, 4), (6, 7), (9, 10)]
    assert total(intersection(a, b)) == 4
    assert intersection(a, [(4, 6)]) == []  # touching is not overlapping


@pytest.mark.parametrize("name, kind", [
    ("c10d::allreduce_", "all_reduce"), ("gloo:all_reduce", "all_reduce"),
    ("c10d::_allgather_base_", "all_gather"), ("c10d::allgather_", "all_gather"),
    ("gloo:all_gather", "all_gather"), ("c10d::_reduce_scatter_base_", "reduce_scatter"),
    ("c10d::reduce_scatter_tensor_coalesced_", "reduce_scatter"),
    ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", "reduce_scatter"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "all_reduce"), ("c10d::broadcast_", "broadcast"),
    ("aten::mm", None), ("Optimizer.step#AdamW.step", None)])
def test_collective_kind(name, kind):
    assert collective_kind(name) == kind


def test_a_ddp_step_breaks_down_into_phases_and_overlap():
    """Hand-made: DDP issues an all-reduce in backward; gloo runs it on its thread while backward
    still computes; the training thread then waits for it (no event) until the optimizer starts."""
    trace = [
        event("ProfilerStep#2", 0, 100), event(NEXT_BATCH, 1, 3), event("aten::flip", 3, 5),
        event("DistributedDataParallel.forward", 10, 40), event("aten::linear", 11, 39),
        event("Optimizer.zero_grad#AdamW.zero_grad", 41, 42),
        event(BACKWARD + "MmBackward0", 45, 60), event("aten::mm", 46, 59),
        event("c10d::allreduce_", 50, 51), event("gloo:all_reduce", 51, 75, thread=GLOO_A),
        event(BACKWARD + "AddmmBackward0", 60, 70), event("aten::mm", 61, 67),
        event("Optimizer.step#AdamW.step", 88, 98), event("aten::_foreach_add_", 89, 97)]
    [step] = analyze_trace(trace)
    assert step["step_ms"] == 100
    assert step["forward_ms"] == 35 - 1  # from DDP's forward to backward, less zero_grad
    assert step["backward_ms"] == 88 - 45  # until the optimizer: the wait for the all-reduce too
    assert step["optimizer_ms"] == 10 + 1
    assert step["other_ms"] == 100 - 35 - 43 - 10  # the batch and its augmentation
    assert step["collectives"] == {"all_reduce": dict(calls=1, ms=24)}
    assert step["communication_ms"] == 24
    assert step["overlapped_ms"] == (59 - 51) + (67 - 61)  # while aten::mm ran, not in the gaps


def test_reduce_scatter_is_counted_as_issued_and_timed_as_gloo_ran_it():
    """gloo runs a reduce-scatter as an all-reduce; runs on two threads can start out of order."""
    trace = [event("ProfilerStep#3", 0, 20), event("c10d::_allgather_base_", 1, 1.5),
             event("c10d::_reduce_scatter_base_", 2, 2.5),
             event("c10d::allreduce_", 2.1, 2.2),  # nested in the reduce-scatter: not a call
             event("gloo:all_reduce", 3, 10, thread=GLOO_A),
             event("gloo:all_gather", 3.5, 5, thread=GLOO_B)]
    [step] = analyze_trace(trace)
    assert step["collectives"] == {"all_gather": dict(calls=1, ms=1.5),
                                   "reduce_scatter": dict(calls=1, ms=7)}
    assert step["communication_ms"] == 7 and step["overlapped_ms"] == 0


def test_micro_batches_of_one_optimizer_step():
    """Gradient accumulation: two forward and backward passes, one all-reduce (the first pass
    under no_sync)."""
    trace = [
        event("ProfilerStep#2", 0, 62), event("DistributedDataParallel.forward", 0, 10),
        event(BACKWARD + "A", 12, 20), event(NEXT_BATCH, 21, 22),
        event("DistributedDataParallel.forward", 25, 35), event(BACKWARD + "A", 36, 44),
        event("c10d::allreduce_", 43, 44), event("gloo:all_reduce", 44, 50, thread=GLOO_A),
        event("Optimizer.step#AdamW.step", 52, 60)]
    [step] = analyze_trace(trace)
    assert step["forward_ms"] == 12 + 11
    assert step["backward_ms"] == 8 + (52 - 36)  # only the last pass waits for the optimizer
    assert step["optimizer_ms"] == 8 and step["other_ms"] == 62 - 23 - 24 - 8
    assert step["collectives"] == {"all_reduce": dict(calls=1, ms=6)}


def profile_flag_parser(train_images=4096):
    parser = Parser("test", lambda parser, args: check_profile_flag(parser, args, train_images))
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps-per-epoch", type=int, default=None)
    parser.add_argument("--checkpoint-dir", default="checkpoints")
    return add_profile_flag(parser)


@pytest.mark.parametrize("flags, error", [
    (["--profile-steps", "-1"], "--profile-steps -1 must be 0 or more"),
    (["--profile-steps", "5", "--steps-per-epoch", "6"],
     "--profile-steps 5 and 2 warm-up steps do not fit in an epoch of 6 steps; use at most 4"),
    (["--profile-steps", "127"],  # 4096 images: 128 steps of 32
     "--profile-steps 127 and 2 warm-up steps do not fit in an epoch of 128 steps; use at most "
     "126"),
    (["--profile-steps", "1", "--checkpoint-dir", "s3://bucket/runs"],
     "--profile-steps 1 writes its traces into --checkpoint-dir: pass a local or mounted folder, "
     "not s3://bucket/runs")])
def test_profile_flag_is_checked(flags, error, capsys):
    with pytest.raises(SystemExit):
        profile_flag_parser().parse_args(flags)
    assert capsys.readouterr().err.strip() == "error: " + error


def test_profile_flag_accepts_what_fits():
    assert profile_flag_parser().parse_args([]).profile_steps == 0
    flags = ["--profile-steps", "4", "--steps-per-epoch", "6"]
    assert profile_flag_parser().parse_args(flags).profile_steps == 4


def test_profile_steps_0_does_nothing(tmp_path):
    profiler = StepProfiler(argparse.Namespace(profile_steps=0), 0, tmp_path)
    for _ in range(5):
        profiler.step()
    assert profiler.profiler is None and not (tmp_path / "profile").exists()


def test_each_attempt_profiles_anew_clearing_an_earlier_attempts_traces(tmp_path):
    """A run from epoch 0, restarted or resumed: its profile replaces an earlier attempt's, whose traces may be of
    more ranks. (The profiler starts after the run's first optimizer step, common/meter.py.)"""
    profile = tmp_path / "profile"
    profile.mkdir()
    stale = profile / "rank3.json.gz"
    stale.write_text("an earlier attempt's")
    fresh = StepProfiler(argparse.Namespace(profile_steps=2), 0, tmp_path)
    fresh.profiler.stop()
    assert not stale.exists()


def small_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def assert_profiled_steps(summary: dict, ranks: int):
    """Every rank's trace and its 2 profiled optimizer steps: the phases add up to the step, every collective kind
    took time, and gloo ran each collective on a thread of its own, off the training thread."""
    assert [rank["rank"] for rank in summary["ranks"]] == list(range(ranks))
    for rank in summary["ranks"]:
        assert len(rank["steps"]) == 2
        for step in rank["steps"]:
            assert step["collectives"] and all(c["ms"] > 0 for c in step["collectives"].values())
            assert step["forward_ms"] > 0 and step["backward_ms"] > 0 and step["optimizer_ms"] > 0
            phases = sum(step[f"{phase}_ms"] for phase in ("forward", "backward", "optimizer", "other"))
            assert phases == pytest.approx(step["step_ms"])
        events = load_trace(rank["trace"])
        training = next(e["tid"] for e in events if e["name"].startswith("ProfilerStep#"))
        runs = [e for e in events if e["name"].startswith("gloo:")]
        assert runs and all(e["tid"] != training for e in runs)


def test_step01s_ddp_run_is_profiled_phase_by_phase_and_its_table_printed(ddp_run, capsys, monkeypatch):
    """The script's own run (torchrun, 2 ranks, 2 micro-batches per step): test_step01 counts its all-reduces. The
    command the run prints prints the table."""
    assert_profiled_steps(profile_summary(ddp_run[1]), ranks=2)
    command = re.search(r"where the time went: (python \S+ \S+)", ddp_run[2].stdout)[1]
    assert command == f"python benchmarks/trace_analysis.py {ddp_run[1]}"
    monkeypatch.setattr(sys, "argv", command.split()[1:])
    runpy.run_path(str(ROOT / "benchmarks/trace_analysis.py"), run_name="__main__")
    table = capsys.readouterr().out
    assert "all_reduce: 2 calls, " in table  # the communication column: calls, ms in all


def test_step04s_fsdp2_run_is_profiled_phase_by_phase_on_both_ranks(fsdp2_run):
    """The script's own run, resumed on 2 workers: test_step04 counts its all-gathers and reduce-scatters."""
    assert_profiled_steps(profile_summary(fsdp2_run[1]), ranks=2)
    assert "profile: 2 optimizer steps after 2 warm-up steps" in fsdp2_run[2].stdout


def all_reduces_per_step(folder, no_sync: bool) -> list:
    """A one-bucket DDP model (one all-reduce per backward), 2 micro-batches per optimizer step, the first under
    no_sync() or not: the all-reduces of each of the 2 profiled steps."""
    model = DistributedDataParallel(small_model())
    optimizer = torch.optim.AdamW(model.parameters())
    profiler = None
    for _ in range(5):
        with model.no_sync() if no_sync else contextlib.nullcontext():
            model(torch.randn(8, 16)).square().mean().backward()
        model(torch.randn(8, 16)).square().mean().backward()
        optimizer.step()
        if profiler is None:  # made after the first step, as the run's meter makes it
            profiler = StepProfiler(argparse.Namespace(profile_steps=2), 0, folder)
        else:
            profiler.step()
        optimizer.zero_grad()
    return [step["collectives"]["all_reduce"]["calls"] for step in profile_summary(folder)["ranks"][0]["steps"]]


@pytest.mark.upstream
def test_ddp_all_reduces_after_every_backward_unless_no_sync(gloo_group_of_one, tmp_path):
    """PyTorch's behaviour that README.md's "skips the first all-reduce with no_sync()" rests on, and that makes
    test_step01's count of all-reduces per step fail if the scripts lost no_sync(): without it, every micro-batch's
    backward all-reduces."""
    assert all_reduces_per_step(tmp_path / "with", no_sync=True) == [1, 1]
    assert all_reduces_per_step(tmp_path / "without", no_sync=False) == [2, 2]
