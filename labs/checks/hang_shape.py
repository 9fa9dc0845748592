"""Hang clinic 3's checks (labs/checks/clinic.py): the last, smaller batch's hits gathered."""
from labs.checks import clinic

CHECKS = clinic.CHECKS
# Where the untouched labs/07_hang_shape.py waits: the rank, the collective, and the line's statement (found in the
# file, so a line added above it moves the number with it; tests/test_labs.py checks that its run shows it).
TRUTH = dict(rank=1, collective="all_gather")  # rank 1: 63 images in its last batch, rank 0 64
WAITS_AT = "dist.all_gather(everyone, mine)"


def run(lab_file) -> list:
    return clinic.run(lab_file, TRUTH, WAITS_AT)
