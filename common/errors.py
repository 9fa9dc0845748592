"""One-line errors for the person at the terminal, printed once however many processes hit them."""
import os


def first_process() -> bool:
    """True in a plain run and in rank 0 of torchrun or Ray Train: the process that speaks for all."""
    return int(os.environ.get("RANK", "0")) == 0


def fail(message: str) -> SystemExit:
    """Raise what this returns: `error: message` on stderr from the first process, a quiet exit elsewhere."""
    return SystemExit(f"error: {message}" if first_process() else 1)
