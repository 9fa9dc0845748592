"""One rank of a lab's check: python -m labs.rank MODULE:FUNCTION LAB_FILE FOLDER, started by labs.harness with
torchrun's environment. Saves what FUNCTION(LAB_FILE) returns to FOLDER/rank<r>.pt, or its traceback to
FOLDER/rank<r>.error (also printed). Its process group's collectives time out after COLLECTIVE_TIMEOUT_S."""
import importlib
import os
import sys
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed.distributed_c10d as c10d

from labs.harness import COLLECTIVE_TIMEOUT_S


def main():
    entry, lab_file, folder = sys.argv[1:]
    module, function = entry.split(":")
    rank = os.environ["RANK"]
    torch.set_num_threads(1)
    # A process group's default timeout, which a rank waiting in a collective that another never joins hits.
    c10d.default_pg_timeout = timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    try:
        result = getattr(importlib.import_module(module), function)(lab_file)
    except BaseException:
        error = traceback.format_exc()
        print(error, file=sys.stderr)
        (Path(folder) / f"rank{rank}.error").write_text(error)
        sys.exit(1)
    torch.save(result, Path(folder) / f"rank{rank}.pt")


if __name__ == "__main__":
    main()
