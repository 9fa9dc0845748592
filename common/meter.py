"""What the benchmarks read from a run: the meter a step makes first thing in train() with the run's folder, steps
after every optimizer step (meter.step(optimizer): the time to first step, what the rank holds right after it, and
--profile-steps' profiler, which starts there), and asks after each epoch to save the run so far there, beside the
checkpoints, as summary.json. The start-up's phases it times through two of PyTorch's global hooks (public API, this
process only), removed at the first step: the first submodule registered (the model is being built, so the data phase
has ended) and the first forward (the model is built and restored, so start-up has ended).
The driver (print_run_summary) adds the wall time to that file, which the benchmarks read, and prints the memory
per rank and a short JSON last line that names it. A local or mounted folder only, as for --profile-steps' traces.
"""
import json
import time
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor
from torch.nn.modules.module import register_module_forward_pre_hook, register_module_module_registration_hook

from .errors import first_process
from .model import build_model, count_params
from .profiling import StepProfiler
from .reporting import gather_from_ranks, memory_table, peak_memory_mb, this_node

# The run's start-up: when each phase ended, in seconds from launch (args.launched, set by make_parser).
STARTUP_PHASES = ("launcher", "data", "model")
SUMMARY_FILE = "summary.json"
HEADLINE = ("step", "world_size", "model", "train_loss", "test_accuracy", "images_per_s", "wall_time_s")


class RunMeter:
    """Start-up phases, time to first step, state memory and the profiler of this rank's attempt at a run. A run
    restarted or resumed keeps the start-up and time to first step of the attempt that trained its first epoch
    (a later attempt's would count the crash and the restart in)."""

    def __init__(self, step: str, args, rank: int, device, run_folder):
        self.step_name, self.args, self.rank, self.device = step, args, rank, device
        self.folder = Path(run_folder)  # step 01's --checkpoint-dir, a Ray run's folder in its storage
        self.startup = dict(launcher=time.time())  # all that ran before train(): torchrun, or Ray and its workers
        self.first_step_s, self.state_memory, self.profiler, self.start, self.params = None, {}, None, None, None
        self.hooks = [register_module_module_registration_hook(self.model_building),
                      register_module_forward_pre_hook(self.first_forward)]

    def model_building(self, *_):
        self.startup.setdefault("data", time.time())

    def first_forward(self, *_):
        self.startup.setdefault("model", time.time())

    def step(self, optimizer) -> None:
        """After every optimizer step of the attempt; the first one's time is the time to first step."""
        if self.first_step_s is None:
            self.first_step_s = time.time() - self.args.launched
            self.state_memory = state_memory_mb(optimizer)
            for hook in self.hooks:  # a global module hook slows every module's call: gone
                hook.remove()
            self.profiler = StepProfiler(self.args, self.rank, self.folder)  # from the second step on
            return
        self.profiler.step()

    def save_summary(self, history: list) -> None:
        """A collective: every rank calls it after each epoch; rank 0 writes the run so far to summary.json."""
        for hook in self.hooks:  # a run without a step (an epoch of none): removing twice does nothing
            hook.remove()
        ranks = gather_from_ranks(dict(self.state_memory, peak_mb=peak_memory_mb(self.device), node=this_node()))
        if self.rank != 0 or "://" in self.args.checkpoint_dir:  # cloud storage: print_run_summary says so
            return
        if self.start is None:  # this attempt's first summary: did it train the run's first epoch?
            earlier = self.folder / SUMMARY_FILE
            self.start = (json.loads(earlier.read_text()) if len(history) > 1 and earlier.exists() else dict(
                time_to_first_step_s=self.first_step_s,
                startup_s={phase: self.startup[phase] - self.args.launched for phase in STARTUP_PHASES}))
            with torch.device("meta"):  # the whole model's count, whatever this rank holds of it: once
                self.params = count_params(build_model(self.args.model))
        last, args = history[-1], self.args
        seconds = sum(h["epoch_time_s"] for h in history)
        summary = dict(
            step=self.step_name, world_size=last["world_size"], device=self.device.type, model=args.model,
            params=self.params, data=args.data, epochs=args.epochs, global_batch_size=args.batch_size,
            grad_accum_steps=args.grad_accum_steps, train_loss=last["train_loss"],
            test_accuracy=last["test_accuracy"],
            # every epoch of the run, those trained before a restart included
            images_per_s=sum(h["images_per_s"] * h["epoch_time_s"] for h in history) / seconds,
            time_to_first_step_s=self.start["time_to_first_step_s"], peak_memory_mb=[r["peak_mb"] for r in ranks],
            startup_s=self.start["startup_s"],
            memory_per_rank=[{k: v for k, v in r.items() if k != "node"} for r in ranks],
            nodes=len({r["node"] for r in ranks}), history=history)
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / SUMMARY_FILE).write_text(json.dumps(summary, indent=1))


def state_memory_mb(optimizer: torch.optim.Optimizer) -> dict:
    """Exact MB this rank holds for parameters, gradients and optimizer state (state_bytes)."""
    return {f"{name}_mb": nbytes / 2**20 for name, nbytes in state_bytes(optimizer).items()}


def state_bytes(optimizer: torch.optim.Optimizer) -> dict:
    """Bytes this rank holds for parameters, gradients and optimizer state, from the tensors it owns (every
    parameter is the optimizer's): the full model under DDP, only its shard under FSDP (a DTensor's local part)."""
    def nbytes(tensors):
        local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
        return sum(t.numel() * t.element_size() for t in local)

    params = [p for group in optimizer.param_groups for p in group["params"]]
    return dict(params=nbytes(params), grads=nbytes(p.grad for p in params if p.grad is not None),
                optimizer=nbytes(v for state in optimizer.state.values() for v in state.values()
                                 if isinstance(v, torch.Tensor)))


def print_run_summary(run_folder, launched: float) -> None:
    """The end of a run, on the driver: the summary that rank 0 saved in the run's folder gets the wall time; then
    the memory each rank held, and the headline as one short JSON line, the run's last, naming the file. From the
    first process only: in Ray Train's local mode under torchrun, every process runs all of main()."""
    if not first_process():
        return
    if "://" in str(run_folder):
        print(f"the run's summary is kept in a local or mounted --checkpoint-dir only, not in {run_folder}")
        return
    path = Path(run_folder).resolve() / SUMMARY_FILE
    summary = dict(json.loads(path.read_text()), wall_time_s=time.time() - launched)
    path.write_text(json.dumps(summary, indent=1))
    print(memory_table(summary["memory_per_rank"]))
    print(json.dumps(dict(headline(summary), summary=str(path))))


def headline(summary: dict) -> dict:
    """What an attendee reads at the end of a run; the benchmarks read the whole file."""
    return {key: round(summary[key], 4 if key in ("train_loss", "test_accuracy") else 1)
            if isinstance(summary[key], float) else summary[key] for key in HEADLINE}


def summary_of(last_line: dict) -> dict:
    """For the benchmarks and the tests: the whole summary (or step 05's report) that a step's JSON last line names."""
    return json.loads(Path(last_line["summary"]).read_text())
