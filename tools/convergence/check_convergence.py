#!/usr/bin/python3
"""check_convergence.py: does training with a compression method still reach the accuracy of
training without it?

    /usr/bin/python3 tools/convergence/check_convergence.py fp16 bf16 fp4 int4 fp4:ef=1 \\
        --ranks 4 --epochs 20 --tolerance 1.0 --json convergence.json

For the baseline `none` and then for every SPEC given, runs

    braidrun -np RANKS [--fusion-threshold-mb MB] -- /usr/bin/python3 examples/train_digits.py \\
        --epochs EPOCHS --seed SEED --compression SPEC --quiet --json ...

once per --seeds value (one job at a time) and compares the final test accuracy (the mean
over the seeds) with the baseline's. A method passes when its accuracy is at most
--tolerance percentage points below the baseline's (doing better always passes) and the
payload ratio it achieved on the gradients (uncompressed bytes / payload bytes over the whole
run, the lowest over the seeds) is at least --min-payload-ratio (default 1.5), so a method that
never compressed -- e.g. a start_step longer than the run -- cannot pass. A method whose job
fails (non-zero exit, e.g. an unknown spec) is marked ERROR and fails too.

Same start for every method: --seed fixes train_digits.py's initial weights and batch order,
and the harness sets BRAID_SEED (the stochastic-rounding seed) to the same value.

Fusion is on, as braidrun sets it up (--fusion-threshold-mb changes the bucket size, 0 turns
it off). A run is bit-for-bit repeatable either way for fp16, bf16, fp4 and int4: a tensor's
compressed result does not depend on the bucket it was fused into (tests/mp/
compression_mp_test.cc checks this). The sparsifiers select over the whole bucket by default
(granularity=bucket), and which tensors share a bucket depends on timing: repeat those runs
with --fusion-threshold-mb 0 or granularity=tensor.

Test set: 450 digits, so one sample is 0.22 points and the default tolerance of 1.0 point
allows four more misclassified digits than the baseline.

Compression ratio: each job reports rank 0's byte counters; the table shows the achieved
payload ratio (uncompressed / payload bytes of the gradients' method over the whole run, the
lowest over the seeds), which must reach --min-payload-ratio, and the wire ratio (the bytes an
uncompressed all-reduce would send / the bytes actually sent, indices included). For the
sparsifiers, whose spec sets ratio = dense size / k (scalecomp, topk, randomk; default 100),
the achieved dense / k must also reach 90% of it, else the method fails even at full accuracy
(k = ceil(N / ratio), at least 1, per bucket or tensor rounds the ratio down: the digits
model's 10-element bias keeps 1 of 10 at any ratio). A spec with start_step is not held to
its dense / k: its warm-up steps count at full size.

Output: a table (method, accuracy, delta in points, pass/fail, payload ratio, wire ratio) and,
with --json, the same as JSON. Exit code: 0 when every method passes, 1 when any fails, 2 when
the baseline itself
did not run (or on a usage error).

Test-only methods (test_randomk:keep=0.01) need BRAID_TEST_COMPRESSORS=1 in the environment;
the harness passes its environment on to the ranks unchanged, except OMP_NUM_THREADS
(default 1: several ranks on few cores) and BRAID_SEED.
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
REPO = os.path.dirname(os.path.dirname(HERE))
PYTHON = "/usr/bin/python3"  # Debian's, with numpy and scikit-learn (not the PATH python3)
EXAMPLE = os.path.join(REPO, "examples", "train_digits.py")
BASELINE = "none"


def default_braidrun():
    build = os.environ.get("BRAID_BUILD_DIR") or os.path.join(REPO, "build")
    return os.path.join(build, "tools", "braidrun", "braidrun")


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Exit code: 0 every method passes, 1 some method fails, 2 the baseline failed.")
    p.add_argument("specs", nargs="*", metavar="SPEC",
                   help="compression specs to check against `none`, e.g. fp16 fp4:ef=1")
    p.add_argument("--ranks", type=int, default=4, help="ranks per job (default 4)")
    p.add_argument("--epochs", type=int, default=20, help="training epochs (default 20)")
    p.add_argument("--tolerance", type=float, default=1.0,
                   help="largest allowed accuracy drop, percentage points (default 1.0)")
    p.add_argument("--min-payload-ratio", type=float, default=1.5, metavar="X",
                   help="smallest gradient payload ratio a method must achieve (default 1.5)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], metavar="SEED",
                   help="training seeds; accuracy is the mean over them (default 0)")
    p.add_argument("--fusion-threshold-mb", type=float, default=None, metavar="MB",
                   help="braidrun's fusion bucket size (default: braidrun's, 64); 0: no fusion")
    p.add_argument("--braidrun", default=default_braidrun(),
                   help="the braidrun launcher (default: tools/braidrun/braidrun in "
                        "$BRAID_BUILD_DIR, else in build/)")
    p.add_argument("--python", default=PYTHON, help=f"Python for the ranks (default {PYTHON})")
    p.add_argument("--timeout", type=float, default=300,
                   help="seconds one training job may take before it is killed (default 300)")
    p.add_argument("--json", metavar="PATH", help="also write the results here as JSON")
    p.add_argument("--verbose", action="store_true", help="print each job's command and output")
    args = p.parse_args(argv)
    if args.ranks < 1:
        p.error("--ranks must be at least 1")
    if args.epochs < 1:
        p.error("--epochs must be at least 1")
    if args.tolerance < 0:
        p.error("--tolerance must be >= 0")
    if not (os.path.isfile(args.braidrun) and os.access(args.braidrun, os.X_OK)):
        p.error(f"braidrun not found at {args.braidrun} (build it, or pass --braidrun)")
    return args


def run_job(args, spec, seed, workdir):
    """One training job. Returns a dict: accuracy (0..1) or None, wall_s, error (or None),
    and the byte counters of `spec` on rank 0 (bytes, or None)."""
    result_path = os.path.join(workdir, f"result-{len(os.listdir(workdir))}.json")
    cmd = [args.braidrun, "-np", str(args.ranks)]
    if args.fusion_threshold_mb is not None:
        cmd += ["--fusion-threshold-mb", f"{args.fusion_threshold_mb:g}"]
    cmd += ["--", args.python, EXAMPLE, "--epochs", str(args.epochs), "--seed", str(seed),
           "--compression", spec, "--quiet", "--json", result_path]
    env = dict(os.environ, BRAID_SEED=str(seed))
    env.setdefault("OMP_NUM_THREADS", "1")
    if args.verbose:
        print("+ " + " ".join(cmd), flush=True)
    start = time.monotonic()
    try:
        out = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                             text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"seed": seed, "accuracy": None, "wall_s": time.monotonic() - start,
                "error": f"timed out after {args.timeout:g} s"}
    wall = time.monotonic() - start
    if args.verbose:
        sys.stdout.write(out.stdout + out.stderr)
    if out.returncode != 0:
        # The last lines of stderr usually name the cause (e.g. an unknown method).
        tail = [l for l in out.stderr.splitlines() if l.strip()][-3:]
        return {"seed": seed, "accuracy": None, "wall_s": wall,
                "error": f"exit code {out.returncode}: " + " | ".join(tail)}
    try:
        with open(result_path) as f:
            metrics = json.load(f)
    except (OSError, ValueError) as e:
        return {"seed": seed, "accuracy": None, "wall_s": wall,
                "error": f"no result from rank 0: {e}"}
    return {"seed": seed, "accuracy": float(metrics["test_accuracy"]), "wall_s": wall,
            "error": None, "bytes": method_bytes(metrics, spec)}


# Payload bytes per selected element of the sparsifiers: a float32 value (scalecomp and
# randomk: every rank keeps the same indices), or an int32 index and a value (topk).
SPARSE_PAYLOAD_PER_ELEMENT = {"scalecomp": 4, "randomk": 4, "topk": 8}


def method_bytes(metrics, spec):
    """Rank 0's counters for the gradients' method (the entry that is not the loss's "none")."""
    methods = metrics.get("compression_stats") or {}
    if spec == BASELINE:
        return methods.get(BASELINE)
    others = [m for name, m in methods.items() if name != BASELINE]
    return others[0] if len(others) == 1 else None


def ratios(spec, counters):
    """(achieved payload ratio, wire ratio, dense/k and the ratio= it must reach, or None)."""
    if not counters or not counters.get("payload_bytes") or not counters.get("transport_bytes"):
        return None
    achieved = counters["uncompressed_bytes"] / counters["payload_bytes"]
    wire = counters["reference_transport_bytes"] / counters["transport_bytes"]
    method, _, options = spec.partition(":")
    target = dense_per_k = None
    opts = dict(o.split("=", 1) for o in options.split(",") if "=" in o)
    if method in SPARSE_PAYLOAD_PER_ELEMENT and int(opts.get("start_step", 0)) == 0:
        target = float(opts.get("ratio", 100))
        dense_per_k = achieved * SPARSE_PAYLOAD_PER_ELEMENT[method] / 4
    return {"achieved": achieved, "wire": wire, "dense_per_k": dense_per_k, "target": target}


def run_method(args, spec, workdir):
    runs = [run_job(args, spec, seed, workdir) for seed in args.seeds]
    errors = [f"seed {r['seed']}: {r['error']}" for r in runs if r["error"]]
    accuracy = None if errors else statistics.fmean(r["accuracy"] for r in runs)
    # The seed whose run compressed least speaks for the method.
    measured = None if errors else [ratios(spec, r["bytes"]) for r in runs]
    ratio = None
    if measured and all(measured):
        ratio = min(measured, key=lambda r: r["achieved"])
    return {"spec": spec, "accuracy": accuracy, "runs": runs, "ratio": ratio,
            "payload_ratio": ratio["achieved"] if ratio else None,
            "wall_s": sum(r["wall_s"] for r in runs), "error": "; ".join(errors) or None}


def judge(method, baseline_accuracy, tolerance, min_payload_ratio=0.0):
    """Adds delta_points (accuracy - baseline, percentage points), ratio_ok and status to
    `method`."""
    if method["error"]:
        method["delta_points"] = None
        method["ratio_ok"] = None
        method["status"] = "ERROR"
    else:
        method["delta_points"] = 100.0 * (method["accuracy"] - baseline_accuracy)
        method["ratio_ok"] = (method.get("payload_ratio") or 0.0) >= min_payload_ratio
        # A small epsilon so that exactly `tolerance` points (e.g. 4.5 of 450 digits) passes
        # despite float rounding of the accuracies.
        accurate = method["delta_points"] >= -tolerance - 1e-9
        method["status"] = "pass" if accurate and method["ratio_ok"] else "FAIL"
        r = method.get("ratio")
        if r and r["target"] is not None and not r["dense_per_k"] >= 0.9 * r["target"]:
            method["status"] = "FAIL"
            method["ratio_failure"] = (f"achieved dense/k {r['dense_per_k']:.1f} is below 90% "
                                       f"of ratio={r['target']:g}")
    return method


def format_table(baseline, methods, tolerance, min_payload_ratio):
    def pct(x):
        return "-" if x is None else f"{100.0 * x:.2f}%"

    def ratio(m, key):
        r = m.get("ratio")
        if not r or r[key] is None:
            return "-"
        low = key == "achieved" and not m.get("ratio_ok", True)
        return f"{r[key]:.2f}x" + (" (low)" if low else "")

    rows = [("method", "accuracy", "delta (points)", "result", "payload ratio", "wire ratio",
             "time (s)")]
    rows.append((baseline["spec"], pct(baseline["accuracy"]), "baseline",
                 "ERROR" if baseline["error"] else "-", ratio(baseline, "achieved"),
                 ratio(baseline, "wire"), f"{baseline['wall_s']:.1f}"))
    for m in methods:
        delta = "-" if m["delta_points"] is None else f"{m['delta_points']:+.2f}"
        rows.append((m["spec"], pct(m["accuracy"]), delta, m["status"], ratio(m, "achieved"),
                     ratio(m, "wire"), f"{m['wall_s']:.1f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for m in [baseline] + methods:
        if m["error"]:
            lines.append(f"{m['spec']}: {m['error']}")
        if m.get("ratio_failure"):
            lines.append(f"{m['spec']}: {m['ratio_failure']}")
    lines.append(f"tolerance: {tolerance:g} points below the baseline; payload ratio (uncompressed "
                 f"/ payload bytes) at least {min_payload_ratio:g}x; wire ratio: uncompressed "
                 "all-reduce bytes / bytes sent")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    specs = [s for s in args.specs if s != BASELINE]
    print(f"convergence: {args.ranks} ranks, {args.epochs} epochs, seeds "
          f"{' '.join(map(str, args.seeds))}, fusion "
          f"{'default' if args.fusion_threshold_mb is None else f'{args.fusion_threshold_mb:g} MB'}, "
          f"tolerance {args.tolerance:g} points", flush=True)
    with tempfile.TemporaryDirectory(prefix="braid-convergence-") as workdir:
        baseline = run_method(args, BASELINE, workdir)
        print(f"  {BASELINE}: " + (baseline["error"] or f"{100 * baseline['accuracy']:.2f}%")
              + f" ({baseline['wall_s']:.1f} s)", flush=True)
        methods = []
        if not baseline["error"]:
            for spec in specs:
                m = judge(run_method(args, spec, workdir), baseline["accuracy"], args.tolerance,
                          args.min_payload_ratio)
                methods.append(m)
                print(f"  {spec}: " + (m["error"] or f"{100 * m['accuracy']:.2f}%")
                      + f" ({m['wall_s']:.1f} s)", flush=True)
    print(format_table(baseline, methods, args.tolerance, args.min_payload_ratio))
    if baseline["error"]:
        code = 2
    else:
        code = 0 if all(m["status"] == "pass" for m in methods) else 1
    failed = [m["spec"] for m in methods if m["status"] != "pass"]
    print("PASS" if code == 0 else
          f"FAIL: {', '.join(failed)}" if code == 1 else "ERROR: the baseline did not run")
    if args.json:
        report = {"ranks": args.ranks, "epochs": args.epochs, "seeds": args.seeds,
                  "fusion_threshold_mb": args.fusion_threshold_mb, "tolerance_points": args.tolerance,
                  "min_payload_ratio": args.min_payload_ratio,
                  "baseline": baseline, "methods": methods, "passed": code == 0,
                  "failed": failed}
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return code


if __name__ == "__main__":
    sys.exit(main())
