"""Samples every process's CPU every 0.5 s until SIGTERM, per process and per second: with timeline.py's record it
gives each test, shared run and early run its busy core-seconds (account.py).

    python tests/history/account/sampler.py /work/cpu.json &"""
import json
import os
import signal
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")


def read(pid):
    stat = open(f"/proc/{pid}/stat").read()
    cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace").strip()
    fields = stat[stat.rindex(")") + 2:].split()
    return stat[stat.index("(") + 1:stat.rindex(")")], cmd, fields


def machine_busy():
    """The machine's busy ticks since boot: /proc/stat's cpu line less idle and iowait."""
    values = [int(value) for value in open("/proc/stat").readline().split()[1:]]
    return sum(values[:8]) - values[3] - values[4]


def sample(out):
    seen, me, machine = {}, os.getpid(), {}

    def dump(*_):
        with open(out + ".part", "w") as file:
            json.dump(dict(hz=HZ, machine=machine, processes=list(seen.values())), file)
        os.replace(out + ".part", out)

    signal.signal(signal.SIGTERM, lambda *_: (dump(), sys.exit(0)))
    started, dumped, busy = time.time(), time.time(), machine_busy()
    while True:
        now = time.time()
        busy, before = machine_busy(), busy
        machine[str(int(now))] = machine.get(str(int(now)), 0) + busy - before
        for pid in filter(str.isdigit, os.listdir("/proc")):
            if int(pid) == me:
                continue
            try:
                comm, cmd, fields = read(pid)
            except OSError:
                continue
            key = f"{pid}-{fields[19]}"
            ticks = int(fields[11]) + int(fields[12])
            entry = seen.get(key)
            if entry is None:
                entry = seen[key] = dict(pid=int(pid), ppid=int(fields[1]), pgid=int(fields[2]), comm=comm, cmd=cmd,
                                         first=now, old=now - started < 1, ticks=ticks, base=ticks, seconds={})
            delta = ticks - entry["ticks"]
            if delta:
                second = str(int(now))
                entry["seconds"][second] = entry["seconds"].get(second, 0) + delta
            entry.update(last=now, ticks=ticks)
            if cmd:  # an exiting process reads as empty
                entry["cmd"] = cmd
        if now - dumped > 30:
            dump()
            dumped = now
        time.sleep(0.5)


if __name__ == "__main__":
    sample(sys.argv[1])
