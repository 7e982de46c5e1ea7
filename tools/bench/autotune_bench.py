#!/usr/bin/python3
"""autotune_bench.py: braid's autotuning (BRAID_AUTOTUNE) against a grid of fixed settings.

    tools/bench/autotune_bench.py [--build-dir build] [--ranks 2] [--steps 400] [--repeats 3]
                                  [--tensors 200] [--mib 24] [--json PATH]

The workload: a training-like step of --tensors all-reduces (float32, sizes spread
log-uniformly over 256 B to 1 MiB, scaled to --mib MiB in all, enqueued in reverse order as a
backward pass produces them, then waited for), --steps steps, on --ranks ranks of this host
(braidrun, shared memory). No computation: the step is communication only, which is where
the tuned knobs matter most.

--repeats rounds, each running every point of the grid (fusion threshold x ring chunk x
ring window, the cycle time at its default) with the settings fixed, then the same job under
BRAID_AUTOTUNE=1: peers side by side, since this machine's speed drifts over minutes. A
run's figure is the median step time of its last 20% of steps (after tuning has ended, under
autotuning). Printed: each round's best and worst point and the autotuned job's ratio to
that round's best, the step at which tuning ended (the last row of BRAID_AUTOTUNE_LOG) as a
fraction of the job, then each point's median over rounds. Rank 0 prints "RESULT {json}".

As a rank (internal): autotune_bench.py --rank-program --steps N --tensors T --mib M.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

PYTHON = "/usr/bin/python3"
MIB = 1 << 20
KIB = 1 << 10


def rank_program(args):
    import numpy as np
    import braid

    braid.init()
    rng = np.random.default_rng(0)
    raw = np.exp(rng.uniform(math.log(64), math.log(256 * KIB), args.tensors))
    scale = args.mib * MIB / 4 / raw.sum()
    sizes = [max(1, int(x * scale)) for x in raw]
    tensors = [np.full(n, braid.rank() + 1, dtype=np.float32) for n in sizes]
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        handles = [braid.allreduce_async_(t, name=f"grad.{i}", op=braid.Sum)
                   for i, t in reversed(list(enumerate(tensors)))]
        for h in handles:
            braid.synchronize(h)
        times.append(time.perf_counter() - t0)
        for t in tensors:  # keep the values small and exact
            t.fill(braid.rank() + 1)
    tail = times[int(len(times) * 0.8):]
    if braid.rank() == 0:
        print("RESULT " + json.dumps({"step_ms": statistics.median(tail) * 1e3,
                                      "bytes": sum(sizes) * 4}), flush=True)
    braid.shutdown()


def run_job(args, env_extra):
    env = dict(os.environ)
    env.update(env_extra)
    env["PYTHONPATH"] = os.path.join(args.build_dir, "python")
    cmd = [os.path.join(args.build_dir, "tools", "braidrun", "braidrun"), "-np", str(args.ranks),
           PYTHON, os.path.abspath(__file__), "--rank-program", "--steps", str(args.steps),
           "--tensors", str(args.tensors), "--mib", str(args.mib)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    for line in out.stdout.splitlines():
        if "RESULT " in line:  # braidrun prefixes each line with "[rank] "
            return json.loads(line.split("RESULT ", 1)[1])
    sys.exit(f"autotune_bench: no result from {cmd}:\n{out.stdout}\n{out.stderr[-3000:]}")


def tuning_end(log_path):
    """The step of the log's last row (the step at which rank 0 received the final change)."""
    with open(log_path) as f:
        rows = [line.strip().split(",") for line in f if line[0].isdigit()]
    return int(rows[-1][1]), len(rows)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rank-program", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--build-dir", default="build")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tensors", type=int, default=200)
    p.add_argument("--mib", type=float, default=24)
    p.add_argument("--json")
    args = p.parse_args()
    if args.rank_program:
        return rank_program(args)
    args.build_dir = os.path.abspath(args.build_dir)
    grid = [(f, c, w) for f in (0, 4 * MIB, 64 * MIB) for c in (16 * KIB, 256 * KIB, 1 * MIB)
            for w in (1, 4)]
    # Rounds: every grid point and an autotuned job once each, so that peers run side by
    # side (this machine's speed drifts by tens of percent over minutes); the figures are
    # medians over rounds, the autotuned job's against the best point of its own round.
    results = {}
    tuned, ends, ratios = [], [], []
    for round_ in range(args.repeats):
        this_round = {}
        for f, c, w in grid:
            key = f"fusion={f // MIB}MiB chunk={c // KIB}KiB window={w}"
            ms = run_job(args, {"BRAID_FUSION_THRESHOLD": str(f),
                                "BRAID_RING_CHUNK_BYTES": str(c),
                                "BRAID_RING_WINDOW": str(w)})["step_ms"]
            results.setdefault(key, {"runs_ms": []})["runs_ms"].append(ms)
            this_round[key] = ms
        with tempfile.NamedTemporaryFile(suffix=".csv", delete=False) as log:
            path = log.name
        r = run_job(args, {"BRAID_AUTOTUNE": "1", "BRAID_AUTOTUNE_LOG": path})
        step, candidates = tuning_end(path)
        os.unlink(path)
        tuned.append(r["step_ms"])
        ends.append(step / args.steps)
        best_key = min(this_round, key=this_round.get)
        ratios.append(r["step_ms"] / this_round[best_key])
        print(f"round {round_}: best {best_key} {this_round[best_key]:.2f} ms, worst "
              f"{max(this_round.values()):.2f} ms; autotuned {r['step_ms']:.2f} ms "
              f"({ratios[-1]:.3f}x), tuning ended at step {step} of {args.steps} "
              f"({candidates} candidates)", flush=True)
    for key, v in results.items():
        v["median_ms"] = statistics.median(v["runs_ms"])
        print(f"{key:44s} {v['median_ms']:8.2f} ms  {[round(x, 2) for x in v['runs_ms']]}")
    best = min(v["median_ms"] for v in results.values())
    worst = max(v["median_ms"] for v in results.values())
    summary = {"grid_best_ms": best, "grid_worst_ms": worst, "worst_over_best": worst / best,
               "autotune_ms": statistics.median(tuned), "autotune_runs_ms": tuned,
               "autotune_over_round_best": statistics.median(ratios),
               "autotune_over_round_best_runs": ratios,
               "tuning_end_fraction": statistics.median(ends), "tuning_end_fractions": ends,
               "grid": results, "args": vars(args), "load": os.getloadavg()[0]}
    print(f"grid best {best:.2f} ms, worst {worst:.2f} ms ({worst / best:.2f}x); autotuned "
          f"{summary['autotune_ms']:.2f} ms, {summary['autotune_over_round_best']:.3f}x its "
          f"round's best (median of {args.repeats}); tuning ended at "
          f"{100 * summary['tuning_end_fraction']:.0f}% of the job")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
