"""The suite's account: timeline.py's record of when each test phase and shared fixture ran, and sampler.py's
per-process CPU, made into busy core-seconds per test, per shared run (a session- or module-scoped fixture) and per
early run (tests/early.py's lane), per pytest session (.ci/run runs two: the README's tier, then the slow one).

    python tests/history/account/account.py TIMELINE.jsonl CPU.json PYTEST.log OUT.json --machine M --commit C \\
        --command "..."

A process belongs to the early lane if it descends from `tests/early.py --one FILE:RUN` (the Ray that a run starts
included); every other process started after the sampler is the main lane's, and its CPU in each second goes to what
the pytest process was doing then: a shared fixture's setup, else a test's phase, else `(collection)` before the
first test and `(between tests)` after it. Processes that lived less than a sample (0.5 s) are missed: the machine's
own busy time (/proc/stat) is given beside the processes' sum."""
import argparse
import bisect
import collections
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import tiers  # noqa: E402  (tests/tiers.py: the collection, to know each test's early run)


def owners(processes: dict) -> dict:
    """{key: early run name, '(early queue)', or None (the main lane)}, by ancestry."""
    by_pid = collections.defaultdict(list)
    for key, process in processes.items():
        by_pid[process["pid"]].append(key)
    found = {}

    def owner(key, depth=0):
        if key not in found:
            process = processes[key]
            if run := re.search(r"early\.py --one \S+:(\w+)", process["cmd"]):
                found[key] = run[1]
            elif re.search(r"early\.py \S+queue\.json", process["cmd"]):
                found[key] = "(early queue)"
            else:  # the latest process with the parent's pid seen before this one
                parents = [k for k in by_pid.get(process["ppid"], []) if processes[k]["first"] <= process["first"]]
                parent = max(parents, key=lambda k: processes[k]["first"]) if parents and depth < 64 else None
                found[key] = owner(parent, depth + 1) if parent else None
        return found[key]

    for key in processes:
        owner(key)
    return found


def segments(records: list) -> list:
    """The pytest process's time as non-overlapping (start, end, (kind, name)): fixture setups cut out of phases."""
    fixtures = sorted((r["start"], r["end"], ("shared", r["name"])) for r in records if r["kind"] == "fixture")
    out = list(fixtures)
    for start, end, owner in sorted((r["start"], r["end"], ("test", r["id"])) for r in records
                                    if r["kind"] == "phase"):
        at = start
        for f_start, f_end, _ in fixtures:
            if f_start < end and f_end > at:
                if f_start > at:
                    out.append((at, f_start, owner))
                at = max(at, f_end)
        if at < end:
            out.append((at, end, owner))
    return sorted(out)


def per_second(process: dict) -> dict:
    """{second: ticks}; what it had used before it was first seen, at that second."""
    series = {int(second): ticks for second, ticks in process["seconds"].items()}
    first = int(process["first"])
    series[first] = series.get(first, 0) + process["base"]
    return series


def spread(main: dict, segs: list, begin: float) -> collections.Counter:
    """The main lane's core-seconds per second, shared among the segments of that second by their overlap."""
    core, starts = collections.Counter(), [s[0] for s in segs]
    for second, value in main.items():
        lo, hi = second - 0.5, second + 1.0  # a sample at `second` read the ticks of the half second before it
        i = max(bisect.bisect_right(starts, lo) - 1, 0)
        shares = []
        while i < len(segs) and segs[i][0] < hi:
            if (overlap := min(hi, segs[i][1]) - max(lo, segs[i][0])) > 0:
                shares.append((overlap, segs[i][2]))
            i += 1
        if not shares:
            core["main", "(collection)" if not segs or second < segs[0][0] else "(between tests)"] += value
        for overlap, owner in shares:
            core[owner] += value * overlap / sum(o for o, _ in shares)
    return core


def session_account(records, processes, owner_of, hz, machine, early_seconds, early_tests):
    begin, finish = records[0]["time"], records[-1]["time"]
    main, core, kinds = collections.Counter(), collections.Counter(), collections.Counter()
    early_end = {}
    for key, process in processes.items():
        if process["first"] > finish + 1 or process["last"] < begin - 1:
            continue  # not alive during this session
        owner = owner_of[key]
        for second, ticks in per_second(process).items():
            if owner:
                core["early", owner] += ticks / hz
                kinds[owner, kind_of(process)] += ticks / hz
            elif begin - 1 <= second <= finish + 1:
                main[second] += ticks / hz
        if owner:
            early_end[owner] = max(early_end.get(owner, 0), process["last"])
    core.update(spread(main, segments(records), begin))
    phases = [r for r in records if r["kind"] == "phase"]
    main_work = [r["end"] for r in phases if r["id"] not in early_tests]
    runs = {name: dict(seconds=early_seconds[name], core_seconds=round(core["early", name], 1),
                       processes={kind: round(value, 1) for (run, kind), value in kinds.most_common()
                                  if run == name and value >= 2})
            for name in early_end if name in early_seconds}
    args = " ".join(records[0].get("args", []))
    tier = "slow tier" if "-m slow" in args else "README's tier" if "not slow" in args else "whole suite"
    in_phases = sum(r["end"] - r["start"] for r in phases)
    return dict(
        tier=tier, pytest_seconds=round(finish - begin, 1), overhead_seconds=round(finish - begin - in_phases, 1),
        tests=len({r["id"] for r in phases}),
        machine_busy_core_seconds=round(sum(v for s, v in machine.items() if begin <= int(s) <= finish) / hz, 1),
        processes_core_seconds=round(sum(core.values()), 1),
        outside={name: round(value, 1) for (kind, name), value in core.items() if kind == "main"},
        early_queue_core_seconds=round(core["early", "(early queue)"], 1),
        main_lane_seconds=round(max(main_work, default=begin) - begin, 1),
        early_lane_seconds=round(max((v for k, v in early_end.items() if k in runs), default=begin) - begin, 1),
        early=runs), core, phases


def kind_of(process: dict) -> str:
    if title := re.match(r"ray::(\w+)", process["cmd"]):
        return "ray::" + title[1]
    return process["comm"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("timeline")
    parser.add_argument("cpu")
    parser.add_argument("log", help="the run's pytest output: its early-run lines give each run's wall time")
    parser.add_argument("out")
    parser.add_argument("--machine", required=True)
    parser.add_argument("--commit", required=True)
    parser.add_argument("--command", required=True)
    args = parser.parse_args()
    records = [json.loads(line) for line in open(args.timeline)]
    cpu = json.load(open(args.cpu))
    processes = {f"{p['pid']}-{p['first']}": p for p in cpu["processes"] if not p["old"]}
    owner_of = owners(processes)
    log = open(args.log, errors="replace").read()
    early_seconds = {m[1]: float(m[2]) for m in re.finditer(r"early run \d+-(\w+): (\d+) s, its deadline", log)}
    early_tests = {test for test, info in tiers.collected().items()
                   if any(name.startswith("early:") for name in info["shared"])}
    sessions, tests, shared = [], {}, collections.defaultdict(list)
    starts = [i for i, r in enumerate(records) if r["kind"] == "session" and r["event"] == "start"]
    for i, start in enumerate(starts):
        part = records[start:starts[i + 1] if i + 1 < len(starts) else len(records)]
        session, core, phases = session_account(part, processes, owner_of, cpu["hz"], cpu["machine"],
                                                early_seconds, early_tests)
        sessions.append(session)
        for record in phases:
            test = tests.setdefault(record["id"], dict(seconds=0.0, core_seconds=0.0))
            test["seconds"] += record["end"] - record["start"]
        for record in part:
            if record["kind"] == "fixture":
                shared[record["name"]].append(dict(seconds=record["end"] - record["start"], scope=record["scope"],
                                                   core_seconds=core["shared", record["name"]]))
                for phase in phases:  # a test's time is its own, less the shared runs set up in it
                    if phase["start"] <= record["start"] <= phase["end"]:
                        tests[phase["id"]]["seconds"] -= record["end"] - record["start"]
                        tests[phase["id"]].setdefault("sets_up", []).append(record["name"])
                        break
        for (kind, name), value in core.items():
            if kind == "test":
                tests[name]["core_seconds"] += value
    result = dict(
        machine=args.machine, commit=args.commit, command=args.command, date=time.strftime(
            "%Y-%m-%d", time.gmtime(records[0]["time"])), sessions=sessions,
        early={name: run for session in sessions for name, run in session["early"].items()},
        shared={name: dict(seconds=round(sum(s["seconds"] for s in runs) / len(runs), 2), scope=runs[0]["scope"],
                           core_seconds=round(sum(s["core_seconds"] for s in runs) / len(runs), 2),
                           set_up=len(runs)) for name, runs in sorted(shared.items())},
        overhead_seconds=round(sum(s["overhead_seconds"] for s in sessions) / len(sessions), 1),
        tests={name: dict(seconds=round(v["seconds"], 2), core_seconds=round(v["core_seconds"], 2),
                          **({"sets_up": v["sets_up"]} if "sets_up" in v else {})) for name, v in tests.items()})
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
