"""What the benchmarks read from a run, kept out of the training loops: when each start-up phase ended, launch to
the first optimizer step, images per second, memory per rank, the --profile-steps profiler, and the summary that
a run prints as its last line (benchmarks/compare_steps.py reads it)."""
import json
import sys
import time

from .errors import first_process
from .profiling import StepProfiler
from .training import gather_from_ranks, memory_table, peak_memory_mb, state_memory_mb

# The run's start-up, kept in its first epoch's record: a restarted or resumed run reports the first attempt's.
STARTUP_PHASES = ("launcher", "data", "model")


class RunMeter:
    """Created first thing in train(); the step calls phase_ended("data"), training_starts(...) once the model is
    ready, optimizer_stepped() after every optimizer step, epoch_trained(...) before evaluating, summary(...) after."""

    def __init__(self, step: str, args, rank: int, device):
        self.step, self.args, self.rank, self.device = step, args, rank, device
        # All that ran before train(): torchrun's process group, or Ray and its workers.
        self.startup = dict(launcher=time.time())
        self.first_step_s, self.profiler, self.state_memory = None, None, {}

    def phase_ended(self, phase: str) -> None:
        self.startup[phase] = time.time()

    def training_starts(self, profile_folder, start_epoch: int) -> None:
        """The model is built (and restored): the last start-up phase ends, the profiler starts."""
        self.phase_ended("model")
        self.profiler = StepProfiler(self.args, self.rank, profile_folder, start_epoch)

    def optimizer_stepped(self) -> None:
        self.profiler.step()
        if self.first_step_s is None:
            self.first_step_s = time.time() - self.args.launched

    def epoch_trained(self, model, optimizer) -> None:
        """After the epoch's last optimizer step: parameters, gradients and optimizer state this rank holds."""
        self.state_memory = state_memory_mb(model, optimizer)

    def summary(self, history: list, params: int, nodes: list) -> dict:
        """The run so far, as its last line reports it. A collective: every rank calls it, after each epoch."""
        memory = gather_from_ranks(dict(self.state_memory, peak_mb=peak_memory_mb(self.device)))
        if len(history) == 1:  # this attempt trained the run's first epoch
            history[0].update({f"startup_{phase}_s": self.startup[phase] - self.args.launched
                               for phase in STARTUP_PHASES}, time_to_first_step_s=self.first_step_s)
        first, last, args = history[0], history[-1], self.args
        seconds = sum(h["epoch_time_s"] for h in history)
        return dict(
            step=self.step, world_size=last["world_size"], device=self.device.type, model=args.model,
            params=params, data=args.data, epochs=args.epochs, global_batch_size=args.batch_size,
            grad_accum_steps=args.grad_accum_steps, train_loss=last["train_loss"],
            test_accuracy=last["test_accuracy"],
            # every epoch of the run, those trained before a restart included
            images_per_s=sum(h["images_per_s"] * h["epoch_time_s"] for h in history) / seconds,
            time_to_first_step_s=first.get("time_to_first_step_s"), peak_memory_mb=[m["peak_mb"] for m in memory],
            startup_s={phase: first.get(f"startup_{phase}_s") for phase in STARTUP_PHASES},
            memory_per_rank=memory, nodes=len(set(nodes)), history=history)


def print_run_summary(summary: dict, launched: float) -> None:
    """The end of a run: the memory each rank held, then the summary as one JSON line, the run's last (Ray, if
    this process started or joined one, is shut down first). From the first process only: in Ray Train's local mode
    under torchrun, every process runs all of main()."""
    if not first_process():
        return
    wall_time_s = time.time() - launched
    if "ray" in sys.modules:  # Ray's threads print its workers' and raylets' lines whenever they come: none after
        sys.modules["ray"].shutdown()
    print(memory_table(summary["memory_per_rank"]))
    print(json.dumps(dict(summary, wall_time_s=wall_time_s)))
