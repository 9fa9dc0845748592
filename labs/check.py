"""Checks your lab: python -m labs.check LAB, from the repository root (labs/README.md lists the labs).

Runs your file (labs/<lab>.py, or --file), prints each check as PASS or FAIL with a hint for each failure, and
exits with 1 if any failed.
"""
import argparse
import importlib
import os
import sys
import threading
import time
from dataclasses import dataclass

from labs.harness import ROOT
from labs.outcome import Outcome

# Every wait inside a check has a deadline of its own (a collective's, a report's, an actor pool's start); a run that
# waits for anything else ends here, several times the slowest check's time on a busy 2-core machine.
DEADLINE_S = float(os.environ.get("LABS_DEADLINE_S", 300))


@dataclass
class Lab:
    file: str  # under labs/, and under labs/solutions/
    checks: str  # the module whose run(path), or run(path, address) for a Ray lab, checks it
    task: str
    ray: bool = False  # whether the check runs Ray (on --address)


LABS = {
    "01": Lab("01_ddp.py", "labs.checks.ddp", "make a single-process training loop distributed (DDP by hand)"),
    "02": Lab("02_train_func.py", "labs.checks.train_func",
              "move a torchrun training loop onto Ray Train: a TorchTrainer run, a checkpoint every epoch, a resume",
              ray=True),
    "02-hang": Lab("02_hang.py", "labs.checks.hang", "find why a Ray Train run hangs, and fix it", ray=True),
    "04": Lab("04_fully_shard.py", "labs.checks.fully_shard", "shard the model with FSDP2: per block, then the root"),
    "04-accumulate": Lab("04_accumulate.py", "labs.checks.accumulate",
                         "accumulate gradients under FSDP2 with one reduce-scatter per optimizer step"),
    "05": Lab("05_tune.py", "labs.checks.tune", "tune with Ray Tune: a search space, ASHA, a TorchTrainer per trial",
              ray=True),
    "06": Lab("06_predictor.py", "labs.checks.predictor", "classify with Ray Data, loading the model once per actor",
              ray=True),
    "07": Lab("07_tp_plan.py", "labs.checks.tp_plan",
              "split every transformer block across 2 ranks with tensor parallelism: the plan, applied per block"),
    "hang-rank0": Lab("07_hang_rank0.py", "labs.checks.hang_rank0",
                      "the hang clinic: a run that stops after its first epoch; diagnose which rank waits, fix it"),
    "hang-uneven": Lab("07_hang_uneven.py", "labs.checks.hang_uneven",
                       "the hang clinic: a run whose ranks read uneven shards; diagnose which rank waits, fix it"),
    "hang-shape": Lab("07_hang_shape.py", "labs.checks.hang_shape",
                      "the hang clinic: a run that fails gathering its evaluation; diagnose which rank's shape "
                      "differs, fix it"),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("lab", choices=LABS)
    parser.add_argument("--file", help="the file to check (default: labs/<the lab's file>)")
    parser.add_argument("--address", default="local",
                        help="the Ray labs' cluster, HOST:PORT, whose nodes run on this machine: its processes "
                             "write what the check watches into a folder here (default: start Ray here)")
    args = parser.parse_args(argv)
    lab = LABS[args.lab]
    path = (ROOT / "labs" / lab.file) if args.file is None else args.file
    print(f"lab {args.lab}: {lab.task}\nchecking {path}", flush=True)
    start = time.monotonic()
    checks = importlib.import_module(lab.checks)
    deadline = threading.Timer(DEADLINE_S, give_up, (checks.CHECKS,))
    deadline.daemon = True
    deadline.start()
    outcomes = checks.run(path, args.address) if lab.ray else checks.run(path)
    deadline.cancel()
    report(outcomes, start)
    return 0 if all(o.passed for o in outcomes) else 1


def report(outcomes: list, start: float) -> None:
    for o in outcomes:
        print(f"PASS  {o.check}" if o.passed else f"FAIL  {o.check}: {o.failure}")
        if o.hint and not o.passed:
            print(f"      hint: {o.hint}")
    print(f"{sum(o.passed for o in outcomes)} of {len(outcomes)} checks passed in {time.monotonic() - start:.0f} s",
          flush=True)


def give_up(checks: list[str]) -> None:
    """The check's deadline: every check failed, and the process ends (its Ray with it)."""
    hung = Outcome(checks[0], f"the run hung: it did not end within the check's {DEADLINE_S:.0f} s",
                   "a run that neither ends nor fails waits for something: py-spy dump --pid PID shows where each "
                   "process waits (TROUBLESHOOTING.md: the run hangs at a report or a collective)")
    report([hung, *(Outcome(check, "the run did not finish (above)", "") for check in checks[1:])],
           time.monotonic() - DEADLINE_S)
    stop_ray()
    os._exit(1)


def stop_ray() -> None:
    """The Ray this check started stopped, within seconds: os._exit would leave some of its processes running."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        stopping = threading.Thread(target=ray.shutdown, daemon=True)
        stopping.start()
        stopping.join(timeout=15)


if __name__ == "__main__":
    raise SystemExit(main())
