"""The cores a run kept busy on average, from its .proc-stat file (a line a second: the time, then /proc/stat's
first line): python cpu.py FILE..."""
import sys

for path in sys.argv[1:]:
    rows = [line.split() for line in open(path)]
    busy = [sum(map(int, row[2:12])) - int(row[5]) - int(row[6]) for row in rows]  # all but idle and iowait
    seconds = float(rows[-1][0]) - float(rows[0][0])
    core_seconds = (busy[-1] - busy[0]) / 100  # USER_HZ
    print(f"{path}: {core_seconds / seconds:.2f} cores busy over {seconds:.0f} s ({core_seconds:.0f} core-seconds)")
