"""Times a lab's check on each of its wrong answers (tests/test_labs.py's WRONG_ANSWERS), one after the other, each as
an attendee runs it (`python -m labs.check LAB --file ANSWER`, its own Ray): wall seconds, and the machine's busy
core-seconds from /proc/stat (Ray's processes included), with the verdicts it printed. Run it with nothing else on
the machine, from the repository's root:

    .venv/bin/python tests/history/account/time_checks.py 05 OUT.json
"""
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]
import test_labs  # noqa: E402
from benchmarks.record import describe_machine  # noqa: E402
from labs.check import LABS  # noqa: E402
from sampler import HZ, machine_busy  # noqa: E402 (this folder's: the account's reading of /proc/stat)


def busy_core_seconds() -> float:
    return machine_busy() / HZ


def timed(lab: str, wrong, folder: Path) -> dict:
    answer = folder / LABS[lab].file
    answer.write_text(test_labs.wrong_answer(lab, wrong))
    started, busy = time.time(), busy_core_seconds()
    done = subprocess.run([sys.executable, "-m", "labs.check", lab, "--file", str(answer)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    return dict(answer=wrong.name, seconds=round(time.time() - started, 1),
                core_seconds=round(busy_core_seconds() - busy, 1),
                verdicts=[line for line in done.stdout.splitlines() if line.startswith(("PASS", "FAIL"))])


def main(lab: str, out: Path) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for wrong in test_labs.WRONG_ANSWERS[lab]:
            rows.append(timed(lab, wrong, Path(folder)))
            print(json.dumps(rows[-1])[:200], flush=True)
    out.write_text(json.dumps(dict(machine=describe_machine(), commit=commit.stdout.strip(), date=time.strftime(
        "%Y-%m-%d"), lab=lab, checks=rows), indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
