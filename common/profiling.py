"""--profile-steps N: a profiler trace per rank of N training steps.

After WARMUP_STEPS optimizer steps, torch.profiler records N more. Then every rank writes its trace to
<folder>/profile/rank<r>.json.gz: open it in https://ui.perfetto.dev or chrome://tracing, or read where
the time went with `python benchmarks/trace_analysis.py <folder>`. The run's meter (common/meter.py)
starts the profiler after the first optimizer step and steps it after every one after that.
"""
import math
import os
import shutil
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity
from tqdm import tqdm

# Not profiled: the first step (allocations, DDP building its buckets, FSDP's lazy init) and the
# second (DDP rebuilds its buckets in the order gradients arrived, and the profiler's own start-up
# cost lands in its first recorded step, which torch.profiler's warm-up discards).
WARMUP_STEPS = 2


def add_profile_flag(parser):
    parser.add_argument("--profile-steps", type=int, default=0, metavar="N",
                        help=f"profile N optimizer steps after {WARMUP_STEPS} warm-up steps: "
                             "a trace per rank, in the run's folder, under profile/")
    return parser


def check_profile_flag(parser, args, train_images: int) -> None:
    """N >= 0, and the warm-up and N steps fit in the first epoch: a step across the end of an
    epoch would also hold the evaluation and the checkpoint."""
    if args.profile_steps < 0:
        parser.reject(args, "--profile-steps", "must be 0 or more")
    if args.profile_steps and "://" in args.checkpoint_dir:
        parser.reject(args, "--profile-steps", "writes its traces into --checkpoint-dir: pass a "
                      f"local or mounted folder, not {args.checkpoint_dir}")
    steps_per_epoch = min(train_images // args.batch_size, args.steps_per_epoch or math.inf)
    if WARMUP_STEPS + args.profile_steps > steps_per_epoch and args.profile_steps:
        parser.reject(args, "--profile-steps", f"and {WARMUP_STEPS} warm-up steps do not fit in an "
                      f"epoch of {steps_per_epoch} steps; use at most "
                      f"{max(0, steps_per_epoch - WARMUP_STEPS)}")


class StepProfiler:
    """Made after the first optimizer step; call step() after every one after it. With --profile-steps 0 it does
    nothing. A restarted or resumed run profiles its first steps again: its profile replaces the earlier attempt's."""

    def __init__(self, args, rank: int, folder):
        self.steps, self.rank = getattr(args, "profile_steps", 0), rank
        self.folder = Path(folder) / "profile"
        self.profiler = None
        if not self.steps:
            return
        if rank == 0:  # an earlier attempt's traces (a larger world leaves more ranks' files): gone
            shutil.rmtree(self.folder, ignore_errors=True)  # before any rank writes: steps come first
        # Kineto's own notes (start, stop, and on a CUDA build without a GPU, an error about it).
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        gpu = [ProfilerActivity.CUDA] if torch.cuda.is_available() else []
        self.profiler = torch.profiler.profile(
            activities=[ProfilerActivity.CPU, *gpu], on_trace_ready=self.write_trace,
            schedule=torch.profiler.schedule(wait=WARMUP_STEPS - 2, warmup=1, active=self.steps,
                                           repeat=1))  # made after the first step: the second warms up
        self.profiler.start()

    def step(self) -> None:
        if self.profiler is None:
            return
        self.profiler.step()  # after the N-th profiled step, this calls write_trace
        if self.profiler.step_num == WARMUP_STEPS - 1 + self.steps:
            self.profiler.stop()
            self.profiler = None

    def write_trace(self, profiler) -> None:
        """Every rank, at the same step: its own trace; rank 0 says where they are."""
        self.folder.mkdir(parents=True, exist_ok=True)
        profiler.export_chrome_trace(str(self.folder / f"rank{self.rank}.json.gz"))
        if self.rank == 0:  # below rank 0's progress bar
            tqdm.write(f"profile: {self.steps} optimizer steps after {WARMUP_STEPS} warm-up steps, a trace "
                       f"per rank: {self.folder}/rank<r>.json.gz (ui.perfetto.dev); where the time went: "
                       f"python benchmarks/trace_analysis.py {self.folder.parent}")
