"""How long each lab's check takes, on its untouched starting file and on its solution, as an attendee runs it.

    python benchmarks/lab_times.py --out benchmarks/published/lab-times   # with nothing else running

`python -m labs.check LAB` (with `--file` for the solution), one after the other, timed wall clock with Python's
start, with no reference run kept from before; the load average before each run is recorded beside it. tables.py
renders the tables from results.json.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.record import ROOT, describe_commit, describe_machine, made_by
from labs.check import LABS


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/lab-times"))
    parser.add_argument("--labs", nargs="+", choices=LABS, default=list(LABS))
    args = parser.parse_args()
    machine, made = describe_machine(), made_by(describe_commit(("labs", "common"), "labs/ or common/"))
    # As on an attendee's machine at the workshop's start: no reference run kept yet (labs.cache.CACHE), so a lab's
    # first check (the untouched file's) makes them, and the next ones read them back.
    with tempfile.TemporaryDirectory() as cache:
        os.environ["LABS_CACHE"] = cache
        runs = [time_check(lab, solution) for lab in args.labs for solution in (False, True)]
    results = dict(machine=machine, **made, runs=runs)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out / 'results.json'}")


def time_check(lab: str, solution: bool) -> dict:
    """One check, as an attendee runs it: its wall time, its verdict, and how busy the machine was before."""
    flags = ["--file", str(Path("labs", "solutions", LABS[lab].file))] if solution else []
    load, start = os.getloadavg()[0], time.monotonic()
    done = subprocess.run([sys.executable, "-m", "labs.check", lab, *flags], cwd=ROOT, capture_output=True, text=True)
    verdict = re.findall(r"^(\d+ of \d+) checks passed", done.stdout, flags=re.MULTILINE)
    run = dict(lab=lab, file="solution" if solution else "untouched", seconds=round(time.monotonic() - start, 1),
               exit_code=done.returncode, passed=verdict[-1] if verdict else None, load_before=round(load, 2))
    print(json.dumps(run), flush=True)
    return run


if __name__ == "__main__":
    main()
