"""Checks your lab: python -m labs.check LAB, from the repository root (labs/README.md lists the labs).

Runs your file (labs/<lab>.py, or --file), prints each check as PASS or FAIL with a hint for each failure, and
exits with 1 if any failed.
"""
import argparse
import importlib
import time
from dataclasses import dataclass

from labs.harness import ROOT


@dataclass
class Lab:
    file: str  # under labs/, and under labs/solutions/
    checks: str  # the module whose run(path), or run(path, address) for a Ray lab, checks it
    task: str
    ray: bool = False  # whether the check runs Ray (on --address)


LABS = {
    "01": Lab("01_ddp.py", "labs.checks.ddp", "make a single-process training loop distributed (DDP by hand)"),
    "02": Lab("02_train_func.py", "labs.checks.train_func",
              "run a training loop on Ray Train, reporting a checkpoint every epoch, and resume it", ray=True),
    "02-hang": Lab("02_hang.py", "labs.checks.hang", "find why a Ray Train run hangs, and fix it", ray=True),
    "04": Lab("04_fully_shard.py", "labs.checks.fully_shard", "shard the model with FSDP2: per block, then the root"),
    "04-accumulate": Lab("04_accumulate.py", "labs.checks.accumulate",
                         "accumulate gradients under FSDP2 with one reduce-scatter per optimizer step"),
    "05": Lab("05_tune.py", "labs.checks.tune", "tune with Ray Tune: a search space, ASHA, a TorchTrainer per trial",
              ray=True),
    "06": Lab("06_predictor.py", "labs.checks.predictor", "classify with Ray Data, loading the model once per actor",
              ray=True),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("lab", choices=LABS)
    parser.add_argument("--file", help="the file to check (default: labs/<the lab's file>)")
    parser.add_argument("--address", default="local",
                        help="the Ray labs' cluster, HOST:PORT (default: start Ray on this machine)")
    args = parser.parse_args(argv)
    lab = LABS[args.lab]
    path = (ROOT / "labs" / lab.file) if args.file is None else args.file
    print(f"lab {args.lab}: {lab.task}\nchecking {path}", flush=True)
    start = time.monotonic()
    checks = importlib.import_module(lab.checks)
    outcomes = checks.run(path, args.address) if lab.ray else checks.run(path)
    for o in outcomes:
        print(f"PASS  {o.check}" if o.passed else f"FAIL  {o.check}: {o.failure}")
        if o.hint and not o.passed:
            print(f"      hint: {o.hint}")
    passed = sum(o.passed for o in outcomes)
    print(f"{passed} of {len(outcomes)} checks passed in {time.monotonic() - start:.0f} s")
    return 0 if passed == len(outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
