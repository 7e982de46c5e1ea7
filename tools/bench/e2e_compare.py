#!/usr/bin/python3
"""e2e_compare.py: braid-e2e-bench of this build against the same benchmark built from another
revision (before/after), interleaved in one run.

    /usr/bin/python3 tools/bench/e2e_compare.py --build-dir build --base 0a8b21c --repeat 5 \\
        -b 4 -e 64M -f 4 -n 30 -w 5 --ranks 2 --step-tensors 40 --json e2e_before_after.json

--base REV is exported with `git archive` and its braid-e2e-bench built into build/base/<sha>
(once; compare.py's build_base). Every round runs both binaries, the order alternating from
round to round, so a disturbance on this shared machine hits both alike. Each run is one
braid-e2e-bench invocation (a coordinator process and --ranks rank processes; per size the
median over iterations of the slowest rank's time, for the whole runtime, "e2e", and for the
bare Communicator, "bare").

The table shows per size, for each side, the median e2e time over the runs with its spread
(min-max), the ratio before/after (time_base / time_this: > 1 means this build is faster)
and a verdict: "slower" only when every run of this build was slower than every run of the
base (the ranges do not overlap), "faster" likewise, else "within spread". The bare
Communicator runs the same code in both binaries, so its before/after ratio shows how much
the machine alone moved the figures. With --step-tensors the training-like step (fused,
fusion off) gets the same treatment. --fast-path 1 (or 0) runs both sides with
BRAID_FAST_PATH set so: run it once each way for the fast path's before/after. Exit code: 0, or 1 when a run failed.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compare  # noqa: E402  (build_base, wait_idle, background_busy)

SIDES = ("this", "base")


def run_once(exe, args, json_path):
    """One braid-e2e-bench run; returns its JSON document or raises RuntimeError."""
    argv = [exe, "-b", args.minbytes, "-e", args.maxbytes, "-f", args.stepfactor,
            "-n", str(args.iters), "-w", str(args.warmup), "--ranks", str(args.ranks),
            "--json", json_path]
    if args.step_tensors:
        argv += ["--step-tensors", str(args.step_tensors), "--step-iters", str(args.step_iters)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.setdefault("UCX_NET_DEVICES", "lo")
    if args.compression:
        env["BRAID_COMPRESSION"] = args.compression  # the job's default: every e2e all-reduce
    if args.fast_path is not None:
        env["BRAID_FAST_PATH"] = args.fast_path  # both sides alike
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True,
                              timeout=args.run_timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{exe}: no result within {args.run_timeout} s")
    if done.returncode != 0:
        raise RuntimeError(f"{exe} exited {done.returncode}:\n{done.stderr[-2000:]}")
    with open(json_path) as f:
        return json.load(f)


def spread(values):
    return statistics.median(values), min(values), max(values)


def verdict(this, base):
    """"slower" / "faster" only when the two sides' ranges do not overlap."""
    if len(this) < 2 or len(base) < 2:
        return "one run: no spread"
    if min(this) > max(base):
        return "slower"
    if max(this) < min(base):
        return "faster"
    return "within spread"


def row(label, this, base):
    t, tlo, thi = spread(this)
    b, blo, bhi = spread(base)
    return {"what": label, "this_us": t, "this_min": tlo, "this_max": thi, "base_us": b,
            "base_min": blo, "base_max": bhi, "before_over_after": b / t if t else 0.0,
            "verdict": verdict(this, base)}


def summarize(runs):
    """runs[side] = [doc, ...] -> table rows (e2e and bare per size, then the step)."""
    rows = []
    sizes = [r["bytes"] for r in runs["this"][0]["rows"]]
    for i, size in enumerate(sizes):
        for key, name in (("e2e_us_median", "e2e"), ("bare_us_median", "bare")):
            vals = {s: [d["rows"][i][key] for d in runs[s]] for s in SIDES}
            rows.append(dict(row(name, vals["this"], vals["base"]), bytes=size))
    if runs["this"][0].get("step"):
        for key, name in (("fused_step_us_median", "step, fused"),
                          ("unfused_step_us_median", "step, fusion off"),
                          ("single_buffer_us_median", "step as one buffer")):
            vals = {s: [d["step"][key] for d in runs[s]] for s in SIDES}
            rows.append(dict(row(name, vals["this"], vals["base"]),
                             bytes=runs["this"][0]["step"]["bytes"]))
    return rows


def print_table(rows, args, base_sha):
    method = f", BRAID_COMPRESSION={args.compression}" if args.compression else ""
    print(f"# braid-e2e-bench before/after{method}: base {args.base} = {base_sha[:12]} vs this build; "
          f"{args.repeat} runs each, interleaved; median (min-max) of the per-run medians, us; "
          f"before/after = time_base / time_this (> 1: this build faster)")
    print(f"# {'bytes':>10} {'what':<18} {'this (min-max)':>26} {'base (min-max)':>26} "
          f"{'before/after':>12}  verdict")
    for r in rows:
        this = f"{r['this_us']:.1f} ({r['this_min']:.1f}-{r['this_max']:.1f})"
        base = f"{r['base_us']:.1f} ({r['base_min']:.1f}-{r['base_max']:.1f})"
        print(f"  {r['bytes']:>10} {r['what']:<18} {this:>26} {base:>26} "
              f"{r['before_over_after']:>12.3f}  {r['verdict']}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build-dir", default=os.path.join(compare.REPO, "build"))
    p.add_argument("--base", required=True, metavar="REV", help="git revision to compare with")
    p.add_argument("--base-build-dir", help="default: build/base/<sha>")
    p.add_argument("--repeat", type=int, default=5, help="runs of each side")
    p.add_argument("-b", "--minbytes", default="4")
    p.add_argument("-e", "--maxbytes", default="64M")
    p.add_argument("-f", "--stepfactor", default="4")
    p.add_argument("-n", "--iters", type=int, default=30)
    p.add_argument("-w", "--warmup", type=int, default=5)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--step-tensors", type=int, default=0)
    p.add_argument("--step-iters", type=int, default=5)
    p.add_argument("--compression", metavar="SPEC",
                   help="run both sides with BRAID_COMPRESSION=SPEC (the end-to-end rows and "
                        "the step then go through that method; bare rows stay uncompressed)")
    p.add_argument("--fast-path", choices=("0", "1"),
                   help="BRAID_FAST_PATH for both sides (default: the environment's)")
    p.add_argument("--run-timeout", type=float, default=900)
    p.add_argument("--wait-idle", type=float, default=0,
                   help="before each run, wait up to this many seconds for idle CPUs")
    p.add_argument("--json", help="write the runs and the table here")
    args = p.parse_args(argv)

    this_exe = os.path.join(args.build_dir, "tools", "bench", "braid-e2e-bench")
    if not os.access(this_exe, os.X_OK):
        print(f"e2e_compare: {this_exe} is not built", file=sys.stderr)
        return 2
    base_exe, base_sha = compare.build_base(args.base, args.base_build_dir, "braid-e2e-bench")
    exes = {"this": this_exe, "base": base_exe}
    runs = {s: [] for s in SIDES}
    busy = []
    with tempfile.TemporaryDirectory(prefix="braid_e2e_compare_") as tmp:
        for r in range(args.repeat):
            order = SIDES if r % 2 == 0 else tuple(reversed(SIDES))
            for side in order:
                if args.wait_idle > 0:
                    compare.wait_idle(args.wait_idle)
                busy.append(compare.background_busy())
                start = time.monotonic()
                try:
                    runs[side].append(run_once(exes[side], args, os.path.join(tmp, f"{side}{r}.json")))
                except RuntimeError as e:
                    print(f"e2e_compare: round {r}, {side}: {e}", file=sys.stderr)
                    return 1
                print(f"# round {r + 1}/{args.repeat}: {side} in {time.monotonic() - start:.0f} s",
                      flush=True)
    rows = summarize(runs)
    print_table(rows, args, base_sha)
    loaded = [b for b in busy if b is not None]
    if loaded and max(loaded) >= compare.BUSY_WARN:
        print(f"# warning: other processes kept up to {max(loaded):.0%} of the CPUs busy "
              f"before some runs: the figures are noisy")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"base": args.base, "base_sha": base_sha, "args": vars(args), "rows": rows,
                       "runs": runs, "busy_before_runs": busy}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
