"""Hang clinic 2's checks (labs/checks/clinic.py): uneven shards, one rank runs steps the other never runs."""
from labs.checks import clinic

CHECKS = clinic.CHECKS
# Where the untouched labs/07_hang_uneven.py waits: the rank, the collective, and the line's statement (found in the
# file, so a line added above it moves the number with it; tests/test_labs.py checks that its run shows it).
TRUTH = dict(rank=0, collective="all_reduce")  # DDP's, in backward
WAITS_AT = "loss.backward()"


def run(lab_file) -> list:
    return clinic.run(lab_file, TRUTH, WAITS_AT)
