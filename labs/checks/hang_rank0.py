"""Hang clinic 1's checks (labs/checks/clinic.py): rank 0 alone reduces the epoch's loss."""
from labs.checks import clinic

CHECKS = clinic.CHECKS
# Where the untouched labs/07_hang_rank0.py waits: the rank, the collective, and the line's statement (found in the
# file, so a line added above it moves the number with it; tests/test_labs.py checks that its run shows it).
TRUTH = dict(rank=0, collective="reduce")
WAITS_AT = "dist.reduce(loss_sum, dst=0)"


def run(lab_file) -> list:
    return clinic.run(lab_file, TRUTH, WAITS_AT)
