#!/usr/bin/python3
"""compression_ablation.py: what each part of a compression method costs in final accuracy.

    /usr/bin/python3 tools/bench/compression_ablation.py --build-dir build --workload fmnist \\
        --out bench-out/ablation_fmnist [--ranks 4] [--seeds 0 1] [--resume] \\
        [--variant NAME=SPEC[@LR] ...] [--momentum M] [--schedule cosine|constant]

Trains tools/bench/comm_bound_rank.py's workload (fmnist: the Fashion-MNIST CNN for 3
epochs; lm: the LSTM language model for one epoch) on --ranks ranks of this machine (braidrun,
shared memory: the final score depends on the arithmetic, not on the link, so no test hosts
are needed) once per variant and seed, and reports each variant's final score against
`none`'s from the same seed: the same initial weights, data order and schedule.

A variant is NAME=SPEC, optionally @LR: a braid compression spec, trained at learning rate
LR per rank (times the world size, as the workload's default). The default variants take
ScaleComp at ratio 100 apart (Chen et al., NeurIPS 2020: cyclic local top-k, CLT-k, with
low-pass filtered error feedback, m <- (1 - beta) m + beta (g + m - sent)):

  none                  no compression (the reference)
  scalecomp             scalecomp:ratio=100 (beta 1, cyclic leader, k per bucket)
  beta=0.5, beta=0.1    the low-pass filter
  leader=0              a fixed leader instead of the cyclic one
  start_step            the first tenth of the steps uncompressed (a warm-up)
  granularity=tensor    k per tensor instead of per bucket
  lr/2                  half the learning rate (scaled learning rates and error feedback)

Output in --out: results.json (every run, written after each; --resume keeps the runs it
holds) and table.md (mean final score per variant over the seeds, and its difference from
none's; for lm also the mean of its last five scorings, of which the difference is taken). A
run's time is not a figure here (ranks share the CPUs); time to accuracy is
comm_bound_bench.py's.
"""
import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PYTHON = "/usr/bin/python3"
RANK_PROGRAM = os.path.join(HERE, "comm_bound_rank.py")
_spec = importlib.util.spec_from_file_location("comm_bound_rank", RANK_PROGRAM)
_rank_program = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_rank_program)
# The rank program's recipe per workload (lr per rank, momentum, schedule), which the
# variants' @LR, --momentum and --schedule replace.
RECIPE = _rank_program.DEFAULTS
# The workloads' steps (comm_bound_rank.py's defaults at 4 ranks): fmnist 3 epochs of 468,
# lm one epoch of 320. start_step warms up for about a tenth of them. The language model's
# perplexity moves by 10-20 between two scorings at its constant learning rate, so it is also
# scored every 25 steps and compared by the mean of its last five scorings (steps 225-320);
# the CNN's decaying learning rate leaves its final accuracy steady, scored once at the end.
WORKLOADS = {"fmnist": {"metric": "test_accuracy", "higher": True, "steps": 1404,
                        "extra": ["--epochs", "3"], "eval_every": 0, "tail": 1},
             "lm": {"metric": "valid_perplexity", "higher": False, "steps": 320,
                    "extra": ["--epochs", "1"], "eval_every": 25, "tail": 5}}


def default_variants(workload):
    w = WORKLOADS[workload]
    base = "scalecomp:ratio=100"
    return [("none", "none", None), ("scalecomp", base, None),
            ("beta=0.5", base + ",beta=0.5", None), ("beta=0.1", base + ",beta=0.1", None),
            ("leader=0", base + ",leader=0", None),
            ("start_step", f"{base},start_step={w['steps'] // 10}", None),
            ("granularity=tensor", base + ",granularity=tensor", None),
            ("lr/2", base, RECIPE[workload]["lr"] / 2)]


def parse_variant(text):
    """NAME=SPEC[@LR] -> (name, spec, lr or None)."""
    name, sep, rest = text.partition("=")
    if not sep or not name or not rest:
        raise argparse.ArgumentTypeError(f"'{text}': expected NAME=SPEC[@LR]")
    spec, _, lr = rest.partition("@")
    if lr and not float(lr) > 0:
        raise argparse.ArgumentTypeError(f"'{text}': the learning rate must be positive")
    return name, spec, float(lr) if lr else None


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", default=os.path.join(REPO, "build"))
    p.add_argument("--out", default=os.path.join(REPO, "bench-out", "ablation"))
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="fmnist")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--variant", type=parse_variant, action="append", default=None,
                   help="NAME=SPEC[@LR]; repeat for several (default: ScaleComp's parts)")
    p.add_argument("--resume", action="store_true",
                   help="keep the runs --out/results.json holds; run only the others")
    p.add_argument("--max-steps", type=int, default=0,
                   help="stop each run after this many steps (0: the workload's epochs)")
    p.add_argument("--momentum", type=float, default=None,
                   help="SGD momentum of every variant (default: the workload's, fmnist 0.9, "
                        "lm 0); another momentum: another --out")
    p.add_argument("--schedule", choices=("cosine", "constant"), default=None,
                   help="learning rate of every variant over the run (default: the workload's, "
                        "fmnist cosine decay, lm constant); another schedule: another --out")
    p.add_argument("--run-timeout", type=float, default=3600)
    args = p.parse_args(argv)
    if args.ranks < 1 or args.max_steps < 0:
        p.error("--ranks must be at least 1 and --max-steps at least 0")
    args.variants = args.variant or default_variants(args.workload)
    return args


def check_specs(args):
    """Every variant's spec through braid's own parser before the first job, so that a typo
    in the last variant does not surface hours later; None, or what is wrong. Skipped where
    the build has no Python module (the jobs would then fail on their own)."""
    sys.path.insert(0, os.path.join(os.path.abspath(args.build_dir), "python"))
    try:
        from braid import _braid
    except ImportError:
        return None
    finally:
        sys.path.pop(0)
    bad = []
    for name, spec, _ in args.variants:
        try:
            _braid.canonical_compression(spec)
        except Exception as e:  # braid's InvalidArgumentError: its message says what
            bad.append(f"{name}: {e}")
    return "; ".join(bad) or None


def run_one(args, spec, lr, seed):
    """One job; its RESULT record, or {"error": ...}."""
    braidrun = os.path.join(args.build_dir, "tools", "braidrun", "braidrun")
    w = WORKLOADS[args.workload]
    cmd = [braidrun, "-np", str(args.ranks), PYTHON, RANK_PROGRAM, "--workload", args.workload,
           "--framework", "braid", "--compression", spec, "--seed", str(seed),
           "--eval-every", str(w["eval_every"]), *w["extra"]]
    if lr is not None:
        cmd += ["--lr", str(lr)]
    if args.momentum is not None:
        cmd += ["--momentum", str(args.momentum)]
    if args.schedule is not None:
        cmd += ["--schedule", args.schedule]
    if args.max_steps:
        cmd += ["--max-steps", str(args.max_steps)]
    env = dict(os.environ, UCX_TLS="sm", UCX_NET_DEVICES="lo", OMP_NUM_THREADS="1",
               PYTHONPATH=os.path.join(os.path.abspath(args.build_dir), "python"))
    env.pop("BRAID_COMPRESSION", None)
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=env, timeout=args.run_timeout, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.run_timeout} s"}
    for line in r.stdout.splitlines():
        if line.startswith("[0] RESULT "):
            return json.loads(line[len("[0] RESULT "):])
    return {"error": f"exit {r.returncode}: " + "\n".join(r.stdout.splitlines()[-20:])}


def table(args, runs):
    w = WORKLOADS[args.workload]
    metric = w["metric"]
    default_lr = RECIPE[args.workload]["lr"]

    def scores(name):
        """{seed: (final score, mean of the last w["tail"] scorings)} of variant NAME."""
        got = {}
        for r in runs:
            if r["variant"] == name and "error" not in r["result"]:
                final = r["result"][f"final_{metric}"]
                history = r["result"].get("history") or [{metric: final}]
                tail = [h[metric] for h in history[-w["tail"]:]]
                got[r["seed"]] = (final, statistics.mean(tail))
        return got

    def shown(v):
        return f"{100 * v:.2f}%" if w["higher"] else f"{v:.1f}"

    base = scores("none")
    unit = "points" if w["higher"] else "%"
    name_ = metric.replace("_", " ")
    tail = w["tail"] > 1
    head = f"| variant | spec | lr per rank | seeds | final {name_} (mean) |"
    rule = "|---|---|---:|---:|---:|"
    if tail:
        head += f" mean of the last {w['tail']} scorings |"
        rule += "---:|"
    over = "mean over seeds" + (", of the last scorings" if tail else "")
    lines = [head + f" vs none ({unit}, {over}) |", rule + "---:|"]
    compared = 1 if tail else 0
    for name, spec, lr in args.variants:
        got = scores(name)
        if not got:
            lines.append(f"| {name} | `{spec}` | {lr or default_lr:g} | 0 | failed |"
                         + (" |" if tail else "") + " |")
            continue
        row = f"| {name} | `{spec}` | {lr or default_lr:g} | {len(got)} | "
        row += shown(statistics.mean(v[0] for v in got.values())) + " |"
        if tail:
            row += " " + shown(statistics.mean(v[1] for v in got.values())) + " |"
        diffs = [(100 * (v[compared] - base[s][compared]) if w["higher"]
                  else 100 * (v[compared] / base[s][compared] - 1))
                 for s, v in got.items() if s in base]
        delta = f"{statistics.mean(diffs):+.2f}" if diffs and name != "none" else ""
        lines.append(row + f" {delta} |")
    return lines


def settings(d):
    """What a run's result depends on besides its variant and seed, each default resolved
    (so that --momentum 0 on lm is lm's own setting), from vars(the parsed arguments) or a
    results.json (whose missing keys are the defaults of the time it was written)."""
    recipe = RECIPE[d["workload"]]
    momentum = d.get("momentum")
    return {"workload": d["workload"], "ranks": d["ranks"], "max_steps": d.get("max_steps", 0),
            "momentum": recipe["momentum"] if momentum is None else float(momentum),
            "schedule": d.get("schedule") or recipe["schedule"]}


def main(argv=None):
    args = parse_args(argv)
    if not os.path.exists(os.path.join(args.build_dir, "tools", "braidrun", "braidrun")):
        sys.exit(f"compression_ablation: no braidrun in {args.build_dir} (scripts/build.sh)")
    bad = check_specs(args)
    if bad:
        sys.exit(f"compression_ablation: {bad}")
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "results.json")
    runs = []
    if args.resume and os.path.exists(path):
        with open(path) as f:
            earlier = json.load(f)
        theirs, ours = settings(earlier), settings(vars(args))
        differ = [f"{k} {theirs[k]}, not {ours[k]}" for k in ours if theirs[k] != ours[k]]
        if differ:
            sys.exit(f"compression_ablation: {path} holds runs of other settings ("
                     f"{'; '.join(differ)}): use another --out, or drop --resume")
        runs = [r for r in earlier["runs"] if "error" not in r["result"]]
    for seed in args.seeds:
        for name, spec, lr in args.variants:
            if any((r["variant"], r["spec"], r["lr"], r["seed"]) == (name, spec, lr, seed)
                   for r in runs):
                continue
            started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
            load = round(os.getloadavg()[0], 2)
            t0 = time.monotonic()
            result = run_one(args, spec, lr, seed)
            runs.append({"variant": name, "spec": spec, "lr": lr, "seed": seed,
                         "started": started, "load_before": load,
                         "seconds": time.monotonic() - t0, "result": result})
            metric = WORKLOADS[args.workload]["metric"]
            status = result.get("error") or f"{metric} {result[f'final_{metric}']:.4g}"
            print(f"seed {seed} {name} ({spec}): {status}", flush=True)
            with open(path, "w") as f:
                json.dump({**settings(vars(args)), "runs": runs}, f, indent=1)
    lines = table(args, runs)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if any("error" in r["result"] for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
