"""One rank of a lab's check: python -m labs.rank MODULE:FUNCTION LAB_FILE FOLDER, started by labs.harness with
torchrun's environment. Saves what FUNCTION(LAB_FILE) returns to FOLDER/rank<r>.pt, or its traceback to
FOLDER/rank<r>.error (also printed)."""
import importlib
import os
import sys
import traceback
from pathlib import Path

import torch


def main():
    entry, lab_file, folder = sys.argv[1:]
    module, function = entry.split(":")
    rank = os.environ["RANK"]
    torch.set_num_threads(1)
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
