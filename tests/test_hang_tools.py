"""The hang clinic's tools on torch 2.14.1 and gloo (TROUBLESHOOTING.md, "The run hangs: which rank waits on which
collective"; labs 07-hang-*): what each prints for a real mismatch between 2 processes (tests/mismatch.py), so that
the ladder the docs and the labs teach quotes what the tools print here, and says which do not work on gloo."""
import pickle
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.rendezvous import free_port
from processes import ROOT, kill_tree, start

pytestmark = pytest.mark.upstream
MISMATCH = "tests/mismatch.py"
PY_SPY = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))  # the venv's, not activated


def start_pair(kind: str, folder, **env) -> list[subprocess.Popen]:
    """The 2 ranks of tests/mismatch.py KIND, as torchrun starts them, each writing to folder/rankR."""
    port = str(free_port())
    return [start([sys.executable, MISMATCH, kind], stdout=open(folder / f"rank{rank}", "w"), stderr=subprocess.STDOUT,
                  env=dict(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port, **env))
            for rank in range(2)]


def run_pair(kind: str, folder, **env) -> list[tuple[int, str]]:
    """Each rank's exit status and output; both must end within 60 s (their collectives time out after 3)."""
    ranks = start_pair(kind, folder, **env)
    try:
        codes = [rank.wait(timeout=60) for rank in ranks]
    finally:
        for rank in ranks:
            kill_tree(rank.pid)
    return [(code, (folder / f"rank{rank}").read_text()) for rank, code in enumerate(codes)]


def error_of(output: str) -> str:
    return [line for line in output.splitlines() if "RuntimeError" in line][-1]


def test_a_collective_timeout_says_that_a_rank_waited_but_not_for_which_rank_or_collective(tmp_path):
    """The first rung: with init_process_group(timeout=3 s), a collective that only rank 0 calls fails on both
    ranks after 3 s (rank 1 waits in its next collective, a barrier) with gloo's recv timeout; the message names
    neither the other rank nor the collective, only the traceback's line does. A timeout closes the rank's
    connections: a peer whose own 3 s are not quite up (a busy machine) reads that instead."""
    (code0, out0), (code1, out1) = run_pair("skipped", tmp_path)
    assert code0 == code1 == 1
    errors = [error_of(out0), error_of(out1)]
    timeout = "Timed out waiting 3000ms for recv operation to complete"
    assert any(timeout in error for error in errors), errors
    assert all(timeout in error or "Connection closed by peer" in error for error in errors), errors
    assert "dist.all_reduce(torch.ones(3))" in out0 and "dist.barrier()" in out1


def test_monitored_barrier_names_the_rank_that_did_not_arrive(tmp_path):
    """The second rung: rank 0's monitored_barrier (gloo only) names rank 1, which still waits in an all-reduce
    that rank 0 skipped; rank 1 learns only that its all-reduce timed out."""
    (code0, out0), (code1, out1) = run_pair("late", tmp_path)
    assert code0 == code1 == 1
    assert "[Rank 0]: Rank 1 failed to pass monitoredBarrier in 3000 ms" in error_of(out0), out0
    assert "Timed out waiting 3000ms for recv operation" in error_of(out1) or "closed by peer" in error_of(out1), out1


def test_distributed_debug_detail_names_the_mismatched_op_and_shape(tmp_path):
    """The third rung: TORCH_DISTRIBUTED_DEBUG=DETAIL checks every collective's op and shapes across the ranks
    first. Without it, an all-reduce of 3 values on rank 0 against 4 on rank 1 lets rank 0 finish (exit 0, its sum
    taken from 3 of rank 1's 4 values) while rank 1 sees its peer leave; with it, both ranks fail naming the shapes.
    A collective only rank 0 calls shows as rank 0's ALLREDUCE against rank 1's barrier, which gloo's fingerprint
    calls a REDUCE of sequence number 0."""
    (code0, _), (code1, out1) = run_pair("shape", tmp_path)
    assert code0 == 0 and code1 == 1 and "Connection closed by peer" in error_of(out1), out1
    (_, out0), (_, out1) = run_pair("shape", tmp_path, TORCH_DISTRIBUTED_DEBUG="DETAIL")
    assert "Detected mismatch between collectives on ranks. Rank 0 is running collective: CollectiveFingerPrint(" \
           "SequenceNumber=1, OpType=ALLREDUCE, TensorShape=[3]" in error_of(out0), out0
    assert error_of(out1).endswith("Collectives differ in the following aspects:   Tensor Tensor shapes: 4vs 3"), out1
    (_, out0), _ = run_pair("skipped", tmp_path, TORCH_DISTRIBUTED_DEBUG="DETAIL")
    assert re.search(r"Rank 0 is running collective: CollectiveFingerPrint\(SequenceNumber=1, OpType=ALLREDUCE.*"
                     r"but Rank 1 is running collective: CollectiveFingerPrint\(SequenceNumber=0OpType=REDUCE\)\."
                     r"Collectives differ in the following aspects: \s+Sequence number: 1vs 0  Op type: ALLREDUCEvs "
                     r"REDUCE", error_of(out0)), out0


def test_the_flight_recorder_records_on_gloo_but_neither_dumps_on_a_timeout_nor_is_analyzed(tmp_path):
    """The fourth rung, left out of the labs: with TORCH_FR_BUFFER_SIZE, gloo's process group records each
    collective (op, sizes, sequence number), but nothing dumps it when a collective times out (TORCH_FR_DUMP_TEMP_FILE
    is NCCL's watchdog's: no file appears), and torchfrtrace fails on the dumps a rank makes itself
    (torch._C._distributed_c10d._dump_fr_trace, private): KeyError, the gloo dump's process group has no name."""
    dumps, auto = tmp_path / "dumps", tmp_path / "auto"
    dumps.mkdir()
    auto.mkdir()
    run_pair("skipped", tmp_path, TORCH_FR_BUFFER_SIZE="100", TORCH_FR_DUMP_TEMP_FILE=f"{auto}/rank_",
             FR_DIR=str(dumps))
    assert list(auto.iterdir()) == []
    records = [pickle.loads((dumps / f"rank_{rank}").read_bytes())["entries"] for rank in range(2)]
    last = [(entry["profiling_name"], entry["collective_seq_id"], entry["input_sizes"]) for entry in
            (rank[-1] for rank in records)]
    assert last == [("gloo:all_reduce", 2, [[3]]), ("gloo:barrier", 2, [])], last
    analyzed = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(dumps)],
                              capture_output=True, text=True, timeout=60)
    assert analyzed.returncode == 1 and "KeyError: ('0', 0)" in analyzed.stderr, analyzed.stderr[-2000:]


def test_py_spy_dump_shows_the_line_each_rank_waits_on(tmp_path):
    """The fifth rung: py-spy dump --pid on each hung rank shows the collective and the line of the script
    (rank 0 in the all-reduce only it calls, rank 1 in the barrier after it)."""
    ranks = start_pair("skipped", tmp_path, TIMEOUT_S="30")
    try:
        deadline = time.monotonic() + 60
        while not all("waits" in (tmp_path / f"rank{r}").read_text() for r in range(2)):
            assert time.monotonic() < deadline and all(rank.poll() is None for rank in ranks), "the ranks never waited"
            time.sleep(0.2)
        time.sleep(1)  # into the collective
        stacks = [subprocess.run([PY_SPY, "dump", "--pid", str(rank.pid)], capture_output=True, text=True,
                                 timeout=60).stdout for rank in ranks]
    finally:
        for rank in ranks:
            kill_tree(rank.pid)
    metric = line_of("# the metric, reduced inside `if rank == 0`")
    assert re.search(rf"all_reduce \(torch/distributed/distributed_c10d.py:\d+\)(.|\n)*main \(mismatch.py:{metric}\)",
                     stacks[0]), stacks[0]
    assert re.search(rf"barrier \(torch/distributed/distributed_c10d.py:\d+\)(.|\n)*main \(mismatch.py:{metric + 1}\)",
                     stacks[1]), stacks[1]


def line_of(text: str) -> int:
    lines = (ROOT / MISMATCH).read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if text in line)
