"""common/profiling.py: the interval arithmetic and the reading of a trace, on hand-made traces;
then real profiles over gloo, of DDP (one process) and FSDP2 (two): the collectives they issue."""
import argparse
import contextlib
import json

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from common.flags import Parser
from common.profiling import (StepProfiler, add_profile_flag, analyze_trace, check_profile_flag,
                              collective_kind, intersection, load_trace, total, union)

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


def test_a_restarted_run_keeps_its_profile_and_a_new_one_clears_an_older_attempts_traces(tmp_path):
    """A restart or --resume (start_epoch > 0) of a run already profiled profiles nothing: its profile stays. A run
    from epoch 0, or resumed before any profile was made, removes the traces of an earlier attempt, which may have
    had more ranks."""
    profile = tmp_path / "profile"
    profile.mkdir()
    (profile / "summary.json").write_text("{}")
    resumed = StepProfiler(argparse.Namespace(profile_steps=2), 0, tmp_path, start_epoch=1)
    assert resumed.profiler is None and (profile / "summary.json").exists()
    for start_epoch in (0, 1):
        stale = profile / "rank3.json.gz"
        stale.write_text("an earlier attempt's")
        fresh = StepProfiler(argparse.Namespace(profile_steps=2), 0, tmp_path, start_epoch=start_epoch)
        fresh.profiler.stop()
        assert not stale.exists()
        profile.mkdir()


@pytest.fixture
def one_process_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def small_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


@pytest.mark.parametrize("no_sync", [False, True])
def test_ddp_all_reduces_are_counted_per_optimizer_step(one_process_group, tmp_path, capsys,
                                                        no_sync):
    """Two micro-batches per optimizer step: DDP all-reduces after each backward, unless the first
    runs under no_sync(). A model this small is one bucket: one all-reduce per backward."""
    model = DistributedDataParallel(small_model())
    optimizer = torch.optim.AdamW(model.parameters())
    profiler = StepProfiler(argparse.Namespace(profile_steps=2), 0, tmp_path)
    for _ in range(5):
        with model.no_sync() if no_sync else contextlib.nullcontext():
            model(torch.randn(8, 16)).square().mean().backward()
        model(torch.randn(8, 16)).square().mean().backward()
        optimizer.step()
        profiler.step()
        optimizer.zero_grad()
    assert profiler.profiler is None  # stopped after its steps
    summary = json.loads((tmp_path / "profile" / "summary.json").read_text())
    [rank] = summary["ranks"]
    assert rank["trace"] == str(tmp_path / "profile" / "rank0.json.gz") and len(rank["steps"]) == 2
    for step in rank["steps"]:
        assert step["collectives"]["all_reduce"]["calls"] == (1 if no_sync else 2)
        assert step["collectives"]["all_reduce"]["ms"] > 0
        assert step["forward_ms"] > 0 and step["backward_ms"] > 0 and step["optimizer_ms"] > 0
        phases = sum(step[f"{phase}_ms"] for phase in ("forward", "backward", "optimizer", "other"))
        assert phases == pytest.approx(step["step_ms"])
    printed = capsys.readouterr().out
    assert printed.count("profile: 2 optimizer steps after 2 warm-up steps") == 1
    assert f"  {1 if no_sync else 2} calls, " in printed  # the all_reduce column: calls, ms in all


def run_fsdp2_rank(rank, folder):
    """One of two processes: both layers FSDP2 units, profiled for 2 steps."""
    store = dist.FileStore(str(folder / "store"), 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    model = small_model()
    for module in (model[0], model[2], model):
        fully_shard(module)
    optimizer = torch.optim.AdamW(model.parameters())
    profiler = StepProfiler(argparse.Namespace(profile_steps=2), rank, folder)
    for _ in range(4):
        model(torch.randn(8, 16)).square().mean().backward()
        optimizer.step()
        profiler.step()
        optimizer.zero_grad()
    dist.destroy_process_group()


def test_fsdp2_all_gathers_and_reduce_scatters_on_both_ranks(tmp_path):
    """Per step: each layer gathered for forward and again for backward (resharded after forward),
    and its gradients reduce-scattered once; gloo runs them on threads of its own."""
    mp.spawn(run_fsdp2_rank, args=(tmp_path,), nprocs=2)
    summary = json.loads((tmp_path / "profile" / "summary.json").read_text())
    assert [r["rank"] for r in summary["ranks"]] == [0, 1]
    for rank in summary["ranks"]:
        assert len(rank["steps"]) == 2
        for step in rank["steps"]:
            calls = {kind: c["calls"] for kind, c in step["collectives"].items()}
            assert calls == dict(all_gather=4, reduce_scatter=2)
            assert all(c["ms"] > 0 for c in step["collectives"].values())
        events = load_trace(rank["trace"])
        training = next(e["tid"] for e in events if e["name"].startswith("ProfilerStep#"))
        runs = [e for e in events if e["name"] in ("gloo:all_gather", "gloo:all_reduce")]
        assert len(runs) == 2 * (4 + 2) and all(e["tid"] != training for e in runs)
