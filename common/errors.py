"""One-line errors for the person at the terminal, printed once however many processes hit them."""
import os
import time

# How long the other processes wait for the first one to print an error they all hit (see quiet_exit_code).
FIRST_PROCESS_GRACE_S = 10


def first_process() -> bool:
    """True in a plain run and in rank 0 of torchrun or Ray Train: the process that speaks for all."""
    return int(os.environ.get("RANK", "0")) == 0


def fail(message: str) -> SystemExit:
    """Raise what this returns: `error: message` on stderr from the first process, a quiet exit elsewhere."""
    return SystemExit(f"error: {message}" if first_process() else quiet_exit_code(1))


def quiet_exit_code(code: int) -> int:
    """For the other processes: wait before exiting, so that the first one, which hits the same error a little
    later (it may still be importing torch), prints it. torchrun stops every rank as soon as one exits, and would
    stop the first before it spoke. It stops this one as soon as the first exits; on another node, the wait ends."""
    time.sleep(FIRST_PROCESS_GRACE_S)
    return code
