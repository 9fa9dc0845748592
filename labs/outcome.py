"""The outcome of one check of a lab: passed, or what the run showed and the concept to look at."""
import re
from dataclasses import dataclass

# What a rank that waited for a collective in vain says: gloo's timed out, or the other rank left first; Ray Train
# names the ranks that never joined a report. In this order, a timeout told before the peer's leaving it caused
# (labs.ranks.cause_first).
HANG_SIGNS = ("timed out", "closed by peer", "reset by peer", "have not joined")
HANG_HINT = ("a rank waits in a collective (an all-reduce, DDP's or FSDP's in backward, a barrier, ray.train.report) "
             "until every rank of the group calls it: every rank must call the same collectives, in the same order, "
             "as often (TROUBLESHOOTING.md: the run hangs at a report or a collective)")


@dataclass
class Outcome:
    check: str
    failure: str | None  # what the run showed; None when the check passed
    hint: str  # the concept to look at, shown with a failure

    @property
    def passed(self) -> bool:
        return self.failure is None


def crashed(checks: list[str], error: str) -> list[Outcome]:
    """Every check failed, because the lab's run did not get to the end (said once, with a hang's hint if a rank
    waited in a collective in vain)."""
    error = re.sub(r"\[\S+\.(cc|cpp):\d+\] ", "", error).split(" This is typically")[0]  # gloo's source line
    hung = any(sign in error.lower() for sign in HANG_SIGNS)
    failure = f"the run hung: {error}" if hung else f"the run did not finish: {error}"
    return [Outcome(checks[0], failure, HANG_HINT if hung else "fix the error shown above first"),
            *(Outcome(check, "the run did not finish (above)", "") for check in checks[1:])]


class RunFailed(Exception):
    """A rank raised or hung; the message is its last line (a real error's before a hang's), the traceback was
    printed."""
