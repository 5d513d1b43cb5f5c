#!/usr/bin/env python3
"""Per-kernel totals of an Nsight Compute CSV (`ncu --csv --metrics
gpu__time_duration.sum,dram__bytes_read.sum,...`, as tools/bench/ncu_serve.sh writes it):
launches and time by kernel, then launches, time, DRAM bytes read and their rate by
kernel and grid.

usage: ncu_summary.py REPORT.csv
"""
import collections
import csv
import sys

SCALE = {"ns": 1e-9, "nsecond": 1e-9, "us": 1e-6, "usecond": 1e-6, "ms": 1e-3, "msecond": 1e-3,
         "B": 1, "byte": 1, "KB": 1e3, "Kbyte": 1e3, "MB": 1e6, "Mbyte": 1e6, "GB": 1e9, "Gbyte": 1e9}


def main(path):
    rows = list(csv.reader(l for l in open(path) if l.startswith('"')))
    head, data = rows[0], rows[1:]
    col = {k: head.index(k) for k in ("ID", "Kernel Name", "Grid Size", "Metric Name",
                                     "Metric Value", "Metric Unit")}
    launches = collections.defaultdict(dict)
    for r in data:
        value = float(r[col["Metric Value"]].replace(",", "")) * SCALE.get(r[col["Metric Unit"]], 1)
        launches[r[col["ID"]]][r[col["Metric Name"]]] = value
        launches[r[col["ID"]]]["key"] = (r[col["Kernel Name"]], r[col["Grid Size"]])
    total = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for m in launches.values():
        t = total[m["key"]]
        t[0] += 1
        t[1] += m.get("gpu__time_duration.sum", 0.0)
        t[2] += m.get("dram__bytes_read.sum", 0.0)
    all_time = sum(t[1] for t in total.values())
    print(f"{len(launches)} launches, {all_time * 1e3:.2f} ms")
    # By kernel, every grid together (a prefill's attention launches differ in grid by chunk).
    by_name = collections.defaultdict(lambda: [0, 0.0])
    for (name, _), (n, secs, _) in total.items():
        by_name[name][0] += n
        by_name[name][1] += secs
    for name, (n, secs) in sorted(by_name.items(), key=lambda kv: -kv[1][1]):
        print(f"{name[:24]:24} {n:5} launches {secs * 1e3:9.2f} ms {secs / all_time:6.1%}")
    print()
    for (name, grid), (n, secs, read) in sorted(total.items(), key=lambda kv: -kv[1][1]):
        print(f"{name[:24]:24} grid {grid:16} {n:4} launches {secs * 1e6 / n:8.1f} us each "
              f"{secs / all_time:6.1%}  {read / n / 1e6:8.2f} MB each  {read / secs / 1e9:7.1f} GB/s")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
