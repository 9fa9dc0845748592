"""Runs cut short: why the workshop's hands-on runs pass `--lr 1e-3` (step 01's README, "Cut short, at half the rate").

    python benchmarks/short_runs.py --data-dir DIR --out benchmarks/published/short-runs    # about 10 min, 2 cores

Each row's flags, as one process (train_single_machine.py) and as two (torchrun's train_ddp.py), on CIFAR-10 scored
on its first 1,000 test images, one run after the other: the train loss and test accuracy after the last epoch (the
run's JSON last line). The warmup lasts one epoch however short, so a run cut to a few steps reaches the recipe's
2e-3 within seconds, and then stalls at chance or not by float rounding alone: the two columns, which compute the
same sums in another order, can part. Writes results.json and results.md (the table step 01's README quotes).
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.record import ROOT, describe_commit, describe_machine, made_by

ROWS = [["--epochs", "1", "--steps-per-epoch", "30"], ["--epochs", "2", "--steps-per-epoch", "30"],
        ["--epochs", "2", "--steps-per-epoch", "15"], ["--epochs", "1", "--steps-per-epoch", "30", "--lr", "1e-3"],
        ["--epochs", "2", "--steps-per-epoch", "20", "--lr", "1e-3"]]  # the last: the workshop's
SINGLE = [sys.executable, "01-vanilla-pytorch-ddp/train_single_machine.py"]
DDP = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
       "01-vanilla-pytorch-ddp/train_ddp.py"]
DEADLINE_S = 900  # one run; past it the benchmark fails


def last_line(command: list) -> dict:
    """The run's train loss and test accuracy, from its JSON last line."""
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=DEADLINE_S)
    if done.returncode:
        raise SystemExit(f"error: {' '.join(command)} failed:\n{done.stderr[-2000:]}")
    headline = json.loads(done.stdout.strip().splitlines()[-1])
    return dict(train_loss=headline["train_loss"], test_accuracy=headline["test_accuracy"])


def markdown(results: dict) -> str:
    cell = "{train_loss:.4f}, {test_accuracy:.2%}".format
    lines = [f"# Runs cut short\n\n`{results['command']}`\n\n{results['machine']}; {results['date']}, commit "
             f"{results['commit']}. Train loss and test accuracy (first 1,000 test images) after the last epoch.\n",
             "| flags | one process | two processes |", "|---|---|---|"]
    lines += [f"| `{' '.join(row['flags'])}` | {cell(**row['one'])} | {cell(**row['two'])} |"
              for row in results["rows"]]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True, help="a folder holding the CIFAR-10 cache")
    parser.add_argument("--out", type=Path, default=Path("results/short-runs"))
    args = parser.parse_args()
    made = made_by(describe_commit())
    rows = []
    with tempfile.TemporaryDirectory(prefix="short-runs-") as work:
        for i, flags in enumerate(ROWS):
            common = [*flags, "--data-dir", args.data_dir, "--eval-images", "1000"]
            rows.append(dict(flags=flags, one=last_line([*SINGLE, *common, "--checkpoint-dir", f"{work}/{i}-one"]),
                             two=last_line([*DDP, *common, "--checkpoint-dir", f"{work}/{i}-two"])))
            print(rows[-1], flush=True)
    results = dict(**made, machine=describe_machine(), rows=rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "results.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
