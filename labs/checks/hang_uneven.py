"""Hang clinic 2's checks (labs/checks/clinic.py): uneven shards, one rank runs steps the other never runs."""
from labs.checks import clinic

CHECKS = clinic.CHECKS
# Where the untouched labs/07_hang_uneven.py waits (tests/test_labs.py checks that its run shows it).
TRUTH = dict(rank=0, collective="all_reduce", line=62)  # DDP's, in backward
WAITS_AT = "loss.backward()"  # that line's statement: where it stands in the file now is right too


def run(lab_file) -> list:
    return clinic.run(lab_file, TRUTH, WAITS_AT)
