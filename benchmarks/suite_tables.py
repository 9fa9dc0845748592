"""The test suite's account and tiers as the documents show them (tables.py registers these): rendered from the
JSON that tests/history/account/account.py writes, per pytest session, per test file, per shared run and per early
run, in busy core-seconds."""
import collections

from benchmarks.markdown import table
from benchmarks.record import processor_of


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def measured_on(results: dict) -> str:
    return f"{results['machine']}; {results['date']}, commit {results['commit']}; `{results['command']}`"


def sessions_table(results: dict) -> list:
    """Each pytest session: its tests, its time, the cores' work, and its two lanes (the critical one is longer)."""
    rows = [[session["tier"], session["tests"], f"{session['pytest_seconds']:.0f} s "
             f"({minutes(session['pytest_seconds'])})", f"{session['machine_busy_core_seconds']:.0f}",
             f"{session['machine_busy_core_seconds'] / session['pytest_seconds']:.2f}",
             f"{session['main_lane_seconds']:.0f} s", f"{session['early_lane_seconds']:.0f} s"]
            for session in results["sessions"]]
    return table(["session", "tests", "pytest", "busy core-s", "cores busy", "main lane's work", "early lane"], rows)


def files_table(results: dict, top: int = 12) -> list:
    """The test files that cost most, their shared runs apart."""
    seconds, core, count = collections.Counter(), collections.Counter(), collections.Counter()
    for test, cost in results["tests"].items():
        name = test.split("::")[0].removeprefix("tests/")
        seconds[name] += cost["seconds"]
        core[name] += cost["core_seconds"]
        count[name] += 1
    rows = [[f"`{name}`", count[name], f"{seconds[name]:.0f}", f"{value:.0f}"] for name, value in core.most_common(top)]
    rest = [name for name in core if name not in dict(core.most_common(top))]
    rows.append([f"{len(rest)} other files", sum(count[n] for n in rest), f"{sum(seconds[n] for n in rest):.0f}",
                 f"{sum(core[n] for n in rest):.0f}"])
    return table(["file", "tests", "s in its tests", "busy core-s in its tests"], rows)


def shared_table(results: dict, least: float = 5.0) -> list:
    runs = sorted(results["shared"].items(), key=lambda kv: -kv[1]["core_seconds"])
    return table(["shared run (fixture)", "scope", "s", "busy core-s"], [
        [f"`{name}`", run["scope"], f"{run['seconds']:.0f}", f"{run['core_seconds']:.0f}"]
        for name, run in runs if run["core_seconds"] >= least])


def early_table(results: dict) -> list:
    runs = sorted(results["early"].items(), key=lambda kv: -kv[1]["core_seconds"])
    return table(["early run", "s", "busy core-s", "its busiest processes (core-s)"], [
        [f"`{name}`", f"{run['seconds']:.0f}", f"{run['core_seconds']:.0f}",
         ", ".join(f"{kind} {value:.0f}" for kind, value in list(run["processes"].items())[:3])]
        for name, run in runs])


def account_tables(results: dict) -> list:
    return (sessions_table(results) + [""] + files_table(results) + [""] + shared_table(results) + [""]
            + early_table(results) + ["", f"Measured on {measured_on(results)}."])


def measured_sessions(results: dict) -> list:
    return sessions_table(results) + ["", f"Measured on {measured_on(results)}."]


def tiers_line(results: dict, earlier: dict) -> list:
    """The README's sentence: what each tier takes, measured by .ci/run on a fresh clone, and what it took in the
    earlier account (another machine: the processor sets much of it)."""
    readme, slow = results["sessions"]
    readme_then, slow_then = earlier["sessions"]
    return [f"The README's tier, below: {readme['tests']} tests in {minutes(readme['pytest_seconds'])} of pytest; "
            f"the slow tier (`python -m pytest -m slow`): {slow['tests']} tests in {minutes(slow['pytest_seconds'])}; "
            f"on {results['machine']}, {results['date']}, commit {results['commit']} (`{results['command']}`). "
            f"Earlier, {readme_then['tests']} and {slow_then['tests']} tests in "
            f"{minutes(readme_then['pytest_seconds'])} and {minutes(slow_then['pytest_seconds'])} on "
            f"{processor_of(earlier['machine'])}, commit {earlier['commit']}."]
