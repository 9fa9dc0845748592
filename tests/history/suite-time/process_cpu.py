"""Where a run's CPU time goes, per kind of process: the profiles beside this file.

    # from the repository's root: every 0.5 s, each process's own CPU ticks, until killed (SIGTERM)
    python tests/history/suite-time/process_cpu.py sample /tmp/cpu.json &
    bash .ci/run --durations=0; kill %1
    # busy core-seconds per kind of process, the 40 largest
    python tests/history/suite-time/process_cpu.py summary /tmp/cpu.json 40

A process's kind is its last title (Ray's workers: ray::RayTrainWorker, ...), else its binary, else its script.
Processes that lived less than a sample are missed; those already running when sampling started are left out."""
import collections
import json
import os
import re
import signal
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")


def sample(out: str) -> None:
    seen = {}

    def dump(*_):
        with open(out + ".part", "w") as file:
            json.dump(list(seen.values()), file)
        os.replace(out + ".part", out)

    signal.signal(signal.SIGTERM, lambda *_: (dump(), sys.exit(0)))
    dumped = time.time()
    while True:
        now = time.time()
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = open(f"/proc/{pid}/stat").read()
                cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            entry = seen.setdefault(f"{pid}-{fields[19]}", dict(pid=int(pid), first=now, cmd=cmd,
                                                                comm=stat[stat.index("(") + 1:stat.rindex(")")]))
            entry.update(last=now, ticks=int(fields[11]) + int(fields[12]))
            if cmd:  # a process that is exiting reads as empty
                entry["cmd"] = cmd
        if now - dumped > 30:
            dump()
            dumped = now
        time.sleep(0.5)


def kind(entry: dict) -> str:
    cmd = entry["cmd"]
    if title := re.match(r"ray::(\w+)", cmd):
        return "ray::" + title[1]
    if entry["comm"] not in ("python", "python3"):
        return "bin:" + entry["comm"]
    words = cmd.split()
    if "-m" in words:
        return "py -m " + words[words.index("-m") + 1]
    script = next((word.rsplit("/", 1)[-1] for word in words[1:] if word.endswith(".py")), None)
    return "py:" + (script or " ".join(w for w in words[1:3] if not w.startswith("-"))[:50])


def summary(path: str, top: int) -> None:
    entries = json.load(open(path))
    start = min(entry["first"] for entry in entries)
    seconds, count = collections.Counter(), collections.Counter()
    for entry in entries:
        if entry["first"] > start:
            name = kind(entry)
            seconds[name] += entry["ticks"] / HZ
            count[name] += 1
    print(f"total {sum(seconds.values()):.0f} core-s")
    for name, value in seconds.most_common(top):
        print(f"{value:7.1f} {count[name]:4d} {name}")


if __name__ == "__main__":
    sample(sys.argv[2]) if sys.argv[1] == "sample" else summary(sys.argv[2], int(sys.argv[3]))
