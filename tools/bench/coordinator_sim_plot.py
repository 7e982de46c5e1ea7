#!/usr/bin/python3
"""Plots braid-coordinator-sim's --json rows: coordinator CPU per step against N x T (the
number of (rank, tensor) submissions a step makes), one line per response-cache setting, and
the line a cost linear in N x T would follow through the smallest world's point.

    tools/bench/coordinator_sim_plot.py --json sim.json [--json more.json] --out sim.png

Rows with the same (ranks, tensors, cache) from several files are reduced to their median.
"""
import argparse
import json
import statistics
import sys


def load(paths):
    groups = {}
    for path in paths:
        with open(path) as f:
            for row in json.load(f):
                key = (row["ranks"], row["tensors"], bool(row["cache"]))
                groups.setdefault(key, []).append(row)
    out = []
    for (ranks, tensors, cache), rows in sorted(groups.items()):
        out.append({
            "ranks": ranks, "tensors": tensors, "cache": cache,
            "cpu_ms": statistics.median(r["coordinator_cpu_ms_per_step"] for r in rows),
            "steps_per_second": statistics.median(r["steps_per_second"] for r in rows),
        })
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="append", required=True, help="braid-coordinator-sim --json output")
    p.add_argument("--out", required=True, help="PNG to write")
    args = p.parse_args(argv)
    rows = load(args.json)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for cache in (True, False):
        pts = [r for r in rows if r["cache"] == cache and r["cpu_ms"] > 0]
        if not pts:
            continue
        x = [r["ranks"] * r["tensors"] for r in pts]
        y = [r["cpu_ms"] for r in pts]
        label = "response cache on" if cache else "response cache off"
        line, = ax.plot(x, y, "o-", label=label)
        ax.plot([x[0], x[-1]], [y[0], y[0] * x[-1] / x[0]], ":", color=line.get_color(),
                label=label + ": linear in N·T")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("N·T (ranks × tensors per step)")
    ax.set_ylabel("coordinator CPU per step (ms)")
    ax.set_title("braid-coordinator under braid-coordinator-sim")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    return 0


if __name__ == "__main__":
    sys.exit(main())
