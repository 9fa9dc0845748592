"""Where the CPU goes while a step trains: what Ray costs beside the training. Linux only (/proc).

    python benchmarks/ray_overhead.py cpu-share --out DIR -- COMMAND...

What it reads, and when: benchmarks/README.md. A process over half a core in the window is a training process, its
busiest thread its training thread. Writes results.json to --out, and results.md from it (tables.py's).
"""
import argparse
import json
import os
import re
import signal
import subprocess
import time
from collections import defaultdict
from pathlib import Path

from benchmarks.record import describe_machine
from benchmarks.tables import cpu_share_markdown

TICKS = os.sysconf("SC_CLK_TCK")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    share = parser.add_subparsers(dest="tool", required=True).add_parser(
        "cpu-share", help="where the CPU goes while COMMAND trains")
    share.add_argument("--after", type=float, default=45.0, help="seconds after launch when the window opens")
    share.add_argument("--seconds", type=float, default=60.0, help="length of the measured window")
    share.add_argument("--out", type=Path, required=True)
    share.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to measure")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        share.error("no command to measure: put it after --")
    args.out.mkdir(parents=True, exist_ok=True)
    report = cpu_share(command, args)
    (args.out / "results.json").write_text(json.dumps(report, indent=1))
    table = cpu_share_markdown(report)
    (args.out / "results.md").write_text(table)
    print(table)


def cpu_share(command: list, args) -> dict:
    with open(args.out / "run.log", "w") as log:
        run = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                               preexec_fn=let_ctrl_c_interrupt)
        try:
            time.sleep(args.after)
            if run.poll() is not None:
                raise SystemExit(f"error: the command ended after {args.after} s, before the window; see {log.name}")
            before, machine_before, steps_before = thread_stats(), machine_ticks(), steps_done(log.name)
            time.sleep(args.seconds)
            after, machine_after, steps_after = thread_stats(), machine_ticks(), steps_done(log.name)
        finally:
            stop(run)  # the window is all we need: the rest of the run would add nothing
    return summarize(before, after, machine_after - machine_before, steps_after - steps_before, args.seconds, command)


def stop(run: subprocess.Popen) -> None:
    """Ctrl-C for the command's whole process group: torchrun passes it to its ranks, and a Ray driver shuts down
    the local Ray it started (checked: no Ray process is left). SIGKILL if that takes over a minute."""
    if run.poll() is not None:
        return  # it already ended
    os.killpg(run.pid, signal.SIGINT)
    try:
        run.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()


def let_ctrl_c_interrupt() -> None:
    """In the command's process, before it starts: Ctrl-C's default action back. A shell starts background jobs
    (`&`, nohup) with SIGINT ignored, which their children inherit; a Python command would then never see the
    KeyboardInterrupt that stop() relies on."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def thread_stats() -> dict:
    """{(pid, tid): (process name, thread name, user + system ticks, voluntary and involuntary context switches)}
    for every thread on the machine."""
    stats = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:3]
            for tid in os.listdir(f"/proc/{pid}/task"):
                stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
                name_end = stat.rindex(")")  # the thread's name is in parentheses, which it may contain
                thread, fields = stat[stat.index("(") + 1:name_end], stat[name_end + 2:].split()
                ticks = int(fields[11]) + int(fields[12])  # user + system
                name = " ".join(argv).replace("\n", " ").strip() or f"[{thread}]"  # [kernel thread]
                status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
                switches = [int(re.search(rf"^{kind}_ctxt_switches:\s+(\d+)", status, re.M)[1])
                            for kind in ("voluntary", "nonvoluntary")]
                stats[pid, tid] = (name, thread, ticks, *switches)
        except (FileNotFoundError, ProcessLookupError):
            continue  # ended while being read
    return stats


def steps_done(log: str) -> int:
    """The optimizer steps rank 0's progress bar shows so far ("epoch 1:  19%|...| 74/390 [...")."""
    counts = re.findall(r"\| (\d+)/\d+ \[", Path(log).read_text(errors="replace"))
    if not counts:
        raise SystemExit(f"error: no progress bar in {log} when the window opened or closed; pass a larger --after")
    return int(counts[-1])


def machine_ticks() -> int:
    """Busy ticks of the whole machine, all cores (user, nice, system, irq, softirq, steal)."""
    fields = [int(f) for f in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(fields) - fields[3] - fields[4]  # less idle and iowait


def summarize(before: dict, after: dict, machine_busy: int, steps: int, seconds: float, command: list) -> dict:
    def cores(ticks: int) -> float:
        return ticks / TICKS / seconds
    per_process, per_thread = defaultdict(int), defaultdict(lambda: defaultdict(int))
    names, busiest = {}, {}
    for key, (name, thread, ticks, voluntary, involuntary) in after.items():
        start = before.get(key, (None, None, 0, 0, 0))  # a thread born in the window counts from 0
        used = ticks - start[2]
        names[key[0]] = name
        if used > busiest.get(key[0], (0,))[0]:
            busiest[key[0]] = (used, dict(cores=cores(used), voluntary_switches_per_s=(voluntary - start[3]) / seconds,
                                          involuntary_switches_per_s=(involuntary - start[4]) / seconds))
        per_process[key[0]] += used
        per_thread[key[0]]["main thread" if key[0] == key[1] else thread] += used  # OpenMP's threads share its name
    training = [pid for pid, ticks in per_process.items() if cores(ticks) > 0.5]
    return dict(
        command=" ".join(command), machine=describe_machine(), window_s=seconds, cpus=os.cpu_count(),
        machine_busy_cores=cores(machine_busy), steps_per_s=steps / seconds,
        training_processes=[dict(pid=int(pid), name=names[pid], cores=cores(per_process[pid]),
                                 threads={t: cores(n) for t, n in sorted(per_thread[pid].items(), key=lambda x: -x[1])
                                          if cores(n) >= 0.001},
                                 training_thread=busiest[pid][1])
                            for pid in sorted(training, key=lambda pid: -per_process[pid])],
        other_processes=[dict(pid=int(pid), name=names[pid], cores=cores(ticks))
                         for pid, ticks in sorted(per_process.items(), key=lambda x: -x[1])
                         if pid not in training and cores(ticks) >= 0.002])


if __name__ == "__main__":
    main()
