#!/usr/bin/python3
"""comm_bound_bench.py: training when the network is the bottleneck, braid vs PyTorch DDP.

    sudo /usr/bin/python3 tools/bench/comm_bound_bench.py --build-dir build \\
        --out bench-out/comm_bound [--ranks 4] [--rate 100mbit] [--epochs 3] [--matrix]

One rank per test host (tools/testhosts/braid-testhosts: network namespaces with their own
hostname, PID and IPC namespaces, joined through a bridge by links rate-limited with tc), so
every gradient crosses a link of the configured rate; the ranks start over ssh (braidrun -H,
also for DDP: braidrun launches any command). Needs root.

Workload: examples/train_fashion_mnist.py's CNN (215k float32 parameters, 861 KB of
gradients a step) at 32 images per rank per step (tools/bench/comm_bound_rank.py). Its
computation is a few milliseconds a step while an uncompressed ring all-reduce of 861 KB
over 4 ranks moves 2(n-1)/n x 861 KB = 1.29 MB of payload per rank, about 103 ms at
100 Mbit/s (108 ms in Ethernet frames, what the floor below counts): the
step is communication-bound (the table's "comm share" measures it: 1 - the step time with no
communication, `local`, over the method's step time).

Methods: braid `none`, `fp16`, `fp4`, `powersgd:rank=2`, `scalecomp:ratio=100` (any braid
compression spec), `ddp` (DistributedDataParallel, gloo, uncompressed), `ddp-powersgd:R`
(its powerSGD_hook at rank R), `ddp-fp16` (its fp16_compress_hook), `ddp-braid` (DDP over
the `braid` torch.distributed backend, uncompressed), `ddp-braid-hook:SPEC` (DDP with
braid.torch.ddp_comm_hook and braid's method SPEC, over the braid backend), `local` (no
communication: the computation alone).

Phase 1 (time to accuracy): --ranks hosts at --rate, each method trains --epochs epochs with
the same seed, data order and schedule; the test set is scored every --eval-every steps (off
the training clock). Phase 2 (--matrix, step time only): --matrix-steps steps of each
--matrix-methods method for every --matrix-ranks x --matrix-rates, and for each run of an
uncompressed method (braid none, DDP) its floor beside the step: the fewest bytes a rank
must send (2(n-1)/n of the gradient bytes, in 1514-byte frames of 1448 bytes of payload) at
the link rate, plus the computation no communication can overlap (zero_grad + forward and
the update, that run's own medians, so two methods' floors differ by their computation), and the bytes each rank's eth0 really sent per timed step
(its counter sees the kernel's GSO packets, up to 64 KB under one set of headers, so it may
read below the minimum in frames, never below the payload). Phase 3 (--sweep): the
nccl-tests all-reduce sweep (float32 sum, --sweep-min to --sweep-max bytes, x4) over the
same links, --ranks hosts at each --matrix-rates: braid (tools/bench/link_allreduce_rank.py,
through its Python API), gloo (torch.distributed) and Open MPI (mpi-allreduce-bench under
mpirun, pml ob1 with the tcp btl on eth0), with busbw against the link rate.

Output in --out: results.json (every run), table.md (the tables below, as printed), and PNG
plots: accuracy_<ranks>x<rate>.png (test accuracy against training time, one line per
method), steps.png (phase 2's step times) and sweep.png (phase 3's busbw). Figures are medians of one run each on a
shared machine: the computation part of a step is sensitive to other load, the link part
is not.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PYTHON = "/usr/bin/python3"
TESTHOSTS = os.path.join(REPO, "tools", "testhosts", "braid-testhosts")
RANK_PROGRAM = os.path.join(HERE, "comm_bound_rank.py")
# Lines that start a failure in a rank's output (Python's exceptions, braid's errors).
FIRST_ERROR = re.compile(r"Traceback|Error|error:|FAILED|can never complete|Fatal")
SWEEP_PROGRAM = os.path.join(HERE, "link_allreduce_rank.py")
SSH_DIR = "/tmp/braid-testhosts/ssh"
SSH = ["--ssh-identity-file", f"{SSH_DIR}/id_ed25519", "--ssh-option",
       "StrictHostKeyChecking=no", "--ssh-option", "UserKnownHostsFile=/dev/null",
       "--ssh-option", "LogLevel=ERROR"]
ACCURACY_METHODS = ["none", "fp16", "fp4", "powersgd:rank=2", "scalecomp:ratio=100", "ddp",
                    "ddp-powersgd:2", "local"]
MATRIX_METHODS = ["none", "fp16", "fp4", "powersgd:rank=1", "powersgd:rank=2",
                  "powersgd:rank=4", "scalecomp:ratio=70", "scalecomp:ratio=100",
                  "scalecomp:ratio=150", "ddp", "ddp-powersgd:1", "ddp-powersgd:2",
                  "ddp-powersgd:4", "ddp-fp16", "local"]


def method_args(method):
    """The rank program's arguments for a method name, and the method's label."""
    if method == "local":
        return ["--framework", "local"], "no communication"
    if method == "ddp":
        return ["--framework", "ddp"], "DDP gloo"
    if method == "ddp-fp16":
        return ["--framework", "ddp", "--ddp-hook", "fp16"], "DDP fp16_compress_hook"
    if method == "ddp-braid":
        return ["--framework", "ddp", "--ddp-backend", "braid"], "DDP braid backend"
    if method.startswith("ddp-braid-hook:"):
        spec = method.split(":", 1)[1]
        return (["--framework", "ddp", "--ddp-backend", "braid", "--ddp-hook", "braid",
                 "--compression", spec], f"DDP braid hook {spec}")
    if method.startswith("ddp-powersgd:"):
        r = method.split(":", 1)[1]
        return (["--framework", "ddp", "--ddp-hook", "powersgd", "--powersgd-rank", r],
                f"DDP powerSGD_hook rank {r}")
    return ["--framework", "braid", "--compression", method], f"braid {method}"


class HostSet:
    """A set of test hosts with an sshd each, torn down on exit whatever happens."""

    def __init__(self, n, rate):
        self.n, self.rate = n, rate
        self.prefix = f"cb{os.getpid() % 100000}{n}{rate[:1]}"

    def __enter__(self):
        r = subprocess.run([TESTHOSTS, "up", "--prefix", self.prefix, "-n", str(self.n),
                            "--rate", self.rate, "--ssh"], stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            self.__exit__()
            raise RuntimeError(f"braid-testhosts up failed: {r.stderr}")
        return self

    def __exit__(self, *exc):
        subprocess.run([TESTHOSTS, "down", "--prefix", self.prefix], stdout=subprocess.DEVNULL)

    def braidrun(self, build, program_args):
        """The command that runs `program_args` on every host (one rank each) from h0."""
        hosts = ",".join(f"h{k}:1" for k in range(self.n))
        return [TESTHOSTS, "exec", "--prefix", self.prefix, "h0", "--", "env",
                "MASTER_ADDR=h0", "MASTER_PORT=29500", f"PYTHONPATH={build}/python",
                f"{build}/tools/braidrun/braidrun", "-np", str(self.n), "-H", hosts, *SSH,
                *program_args]

    def run_job(self, build, method, extra, timeout):
        """Runs one job from h0; returns rank 0's RESULT record (with its label and rate)."""
        args, label = method_args(method)
        cmd = self.braidrun(build, [PYTHON, RANK_PROGRAM, *args, *extra])
        start = time.monotonic()
        try:
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               timeout=timeout, cwd=REPO)
        except subprocess.TimeoutExpired:
            return {"method": method, "label": label, "error": f"timed out after {timeout} s"}
        for line in r.stdout.splitlines():
            if line.startswith("[0] RESULT "):
                rec = json.loads(line[len("[0] RESULT "):])
                rec.update(method=method, label=label, rate=self.rate,
                           job_seconds=time.monotonic() - start)
                return rec
        lines = (r.stdout + r.stderr).splitlines()
        # The first error lines of any rank first: the rank that failed first is often not the
        # one whose lines come last (a survivor reports the peer that left).
        first = [ln for ln in lines if FIRST_ERROR.search(ln)][:8]
        tail = "\n".join(lines[-60:])
        return {"method": method, "label": label,
                "error": f"exit {r.returncode}; first error lines:\n" + "\n".join(first) +
                         f"\n--- last 60 lines ---\n{tail}"}


def run_sweep(args, hosts, build):
    """Phase 3 on one host set: braid, gloo and Open MPI; returns a record per framework."""
    sizes = ["-b", args.sweep_min, "-e", args.sweep_max, "-f", "4", "-n", str(args.sweep_iters),
             "-w", "1"]
    records = []
    for fw in ("braid", "gloo"):
        cmd = hosts.braidrun(build, [PYTHON, SWEEP_PROGRAM, "--framework", fw, *sizes])
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=args.run_timeout, cwd=REPO)
        rec = next((json.loads(l[len("[0] RESULT "):]) for l in r.stdout.splitlines()
                    if l.startswith("[0] RESULT ")), None)
        records.append(rec or {"framework": fw, "error": (r.stdout + r.stderr)[-2000:]})
    hostlist = ",".join(f"h{k}:1" for k in range(hosts.n))
    cmd = [TESTHOSTS, "exec", "--prefix", hosts.prefix, "h0", "--", "mpirun",
           "--allow-run-as-root", "-np", str(hosts.n), "-H", hostlist, "--bind-to", "none",
           "--mca", "plm_rsh_agent", f"ssh -F {SSH_DIR}/config", "--mca", "pml", "ob1",
           "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "eth0",
           f"{build}/tools/bench/mpi-allreduce-bench", *sizes, "-c", "1", "--json",
           "/tmp/mpi-sweep.json"]  # in h0's own /tmp, read back from there
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=args.run_timeout, cwd=REPO)
    read = subprocess.run([TESTHOSTS, "exec", "--prefix", hosts.prefix, "h0", "--", "cat",
                           "/tmp/mpi-sweep.json"], stdout=subprocess.PIPE, text=True)
    try:
        doc = json.loads(read.stdout)
        rows = [x for x in doc["rows"] if x.get("inplace") and x["bytes"] >= 4096]
        records.append({"framework": "openmpi", "ranks": hosts.n, "rows": rows})
    except (ValueError, KeyError):
        records.append({"framework": "openmpi", "error": (r.stdout + r.stderr)[-2000:]})
    for rec in records:
        rec["rate"] = hosts.rate
        last = (rec.get("rows") or [{}])[-1]
        status = rec.get("error", "").splitlines()[-1:] or [
            f"{last.get('bytes')} bytes: {1e3 * last.get('busbw_gbps', 0):.1f} MB/s busbw"]
        print(f"  {hosts.n} ranks {hosts.rate} {rec['framework']}: {status[0]}", flush=True)
    return records


def rate_gbps(rate):
    """tc's rate ("100mbit", "1gbit") in GB/s (1e9 bytes)."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1}
    for u, m in units.items():
        if rate.lower().endswith(u):
            return float(rate[:-len(u)]) * m / 8 / 1e9
    raise ValueError(f"rate '{rate}': expected NNkbit, NNmbit or NNgbit")


# Ethernet frames as tc counts them on the test hosts' links: 1514 bytes (14 of Ethernet
# header, 20 of IP, 32 of TCP with timestamps) carrying 1448 bytes of payload.
FRAME_BYTES, FRAME_PAYLOAD = 1514, 1448


def floor_of(run):
    """The uncompressed step's floor for a run's configuration, (seconds, bytes a rank must
    send): a ring or any bandwidth-optimal all-reduce makes each rank send at least
    2(n-1)/n of the gradient bytes, here in full frames at the link rate, plus the step's
    computation that no communication can overlap (zero_grad + forward and the update, the
    run's own medians). None for runs without the phases (older results)."""
    if "gradient_bytes" not in run or "forward_median_s" not in run:
        return None
    n = run["ranks"]
    payload = 2 * (n - 1) / n * run["gradient_bytes"]
    wire = -(-payload // FRAME_PAYLOAD) * FRAME_BYTES
    seconds = wire / (rate_gbps(run["rate"]) * 1e9)
    return seconds + run["forward_median_s"] + run["update_median_s"], wire


def floor_table(runs, configs):
    """Markdown rows: each uncompressed method's step against its configuration's floor."""
    lines = ["| configuration | method | ms/step | floor ms (wire + zero_grad/forward + "
             "update) | step / floor | KB a rank sent per step: measured (eth0), minimum "
             "payload, minimum in frames |",
             "|---|---|---:|---:|---:|---:|"]
    for n, rate in configs:
        for r in runs:
            if (r.get("ranks"), r.get("rate")) != (n, rate) or "error" in r:
                continue
            if r["method"] not in ("none", "ddp", "ddp-braid"):
                continue  # the floor is the uncompressed gradient's
            fl = floor_of(r)
            if fl is None:
                continue
            floor_s, wire = fl
            wire_s = wire / (rate_gbps(rate) * 1e9)
            sent = r["wire_bytes_timed"] / max(1, r["timed_steps"]) / n
            lines.append(
                f"| {n} ranks {rate} | {r['label']} | {1e3 * r['step_time_median_s']:.1f} | "
                f"{1e3 * floor_s:.1f} ({1e3 * wire_s:.1f} + {1e3 * r['forward_median_s']:.1f}"
                f" + {1e3 * r['update_median_s']:.1f}) | "
                f"{r['step_time_median_s'] / floor_s:.3f} | {sent / 1e3:.0f}, "
                f"{2 * (n - 1) / n * r['gradient_bytes'] / 1e3:.0f}, {wire / 1e3:.0f} |")
    return lines


def sweep_table(records):
    lines = []
    for rate in dict.fromkeys(r["rate"] for r in records):
        recs = [r for r in records if r["rate"] == rate]
        link = rate_gbps(rate)
        names = [r["framework"] for r in recs]
        lines += ["", f"#### {recs[0].get('ranks', '?')} ranks, {rate} links "
                      f"({link:.4f} GB/s per direction): busbw GB/s (% of the link), time ms", "",
                  "| bytes | " + " | ".join(names) + " |", "|---:|" + "---:|" * len(names)]
        sizes = sorted({row["bytes"] for r in recs for row in r.get("rows", [])})
        for b in sizes:
            cells = []
            for r in recs:
                row = next((x for x in r.get("rows", []) if x["bytes"] == b), None)
                cells.append("failed" if row is None else
                             f"{row['busbw_gbps']:.4f} ({100 * row['busbw_gbps'] / link:.0f}%), "
                             f"{row['time_us'] / 1e3:.1f}" +
                             (f", {row['wrong']} wrong" if row.get("wrong") else ""))
            lines.append(f"| {b} | " + " | ".join(cells) + " |")
    return lines


def plot_sweep(records, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rates = list(dict.fromkeys(r["rate"] for r in records))
    fig, axes = plt.subplots(1, len(rates), figsize=(6 * len(rates), 4.5), squeeze=False)
    for ax, rate in zip(axes[0], rates):
        for r in (x for x in records if x["rate"] == rate and x.get("rows")):
            ax.plot([x["bytes"] for x in r["rows"]],
                    [100 * x["busbw_gbps"] / rate_gbps(rate) for x in r["rows"]],
                    marker="o", label=r["framework"])
        ax.axhline(90, color="grey", linewidth=0.8, linestyle=":")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("all-reduce size (bytes)")
        ax.set_ylabel("busbw (% of the link rate)")
        ax.set_title(f"{rate} links")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def time_to(history, target):
    for h in history:
        if h["test_accuracy"] >= target:
            return h["train_time_s"]
    return None


def accuracy_table(runs, target):
    """Markdown rows of phase 1, with the communication share and speed-ups."""
    local = next((r for r in runs if r["method"] == "local" and "error" not in r), None)
    base = {r["method"]: r for r in runs if "error" not in r}
    ref = time_to(base["none"]["history"], target) if "none" in base else None
    lines = [f"| method | time/step (ms) | comm share | time to {100 * target:g}% (s) | "
             "vs braid none | final accuracy | wire MB/step (all ranks) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        if "error" in r:
            lines.append(f"| {r['label']} | failed: {r['error'].splitlines()[0]} | | | | | |")
            continue
        step = r["step_time_median_s"]
        share = (f"{100 * max(0.0, 1 - local['step_time_median_s'] / step):.0f}%"
                 if local and r is not local else "")
        t = time_to(r["history"], target)
        speed = f"{ref / t:.2f}x" if (t and ref) else ""
        lines.append(
            f"| {r['label']} | {1e3 * step:.1f} | {share} | "
            f"{f'{t:.1f}' if t is not None else 'not reached'} | {speed} | "
            f"{100 * r['final_test_accuracy']:.2f}% | {r['wire_bytes'] / r['steps'] / 1e6:.3f} |")
    return lines


def matrix_table(runs, configs):
    cols = [f"{n} ranks {rate}" for n, rate in configs]
    lines = ["| method | " + " | ".join(f"{c}: ms/step" for c in cols) + " |",
             "|---|" + "---:|" * len(cols)]
    for method in dict.fromkeys(r["method"] for r in runs):
        cells = []
        for n, rate in configs:
            r = next((x for x in runs if x["method"] == method and x.get("rate") == rate
                      and x.get("ranks") == n), None)
            cells.append("failed" if r is None or "error" in r
                         else f"{1e3 * r['step_time_median_s']:.1f}")
        label = method_args(method)[1]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def plot_accuracy(runs, path, title, target):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 5))
    lowest = 100 * target
    for r in runs:
        if "error" in r or r["method"] == "local":
            continue
        xs = [h["train_time_s"] for h in r["history"]]
        ys = [100 * h["test_accuracy"] for h in r["history"]]
        lowest = min([lowest] + ys[1:])  # the first score is often near chance: let it go
        ax.plot(xs, ys, marker=".", label=r["label"],
                linestyle="--" if r["framework"] == "ddp" else "-")
    ax.axhline(100 * target, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("training time (s, wall clock, evaluation excluded)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title)
    ax.set_ylim(bottom=max(0.0, lowest - 5), top=100)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_steps(runs, configs, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    methods = list(dict.fromkeys(r["method"] for r in runs))
    fig, ax = plt.subplots(figsize=(10, 5))
    width = 0.8 / max(1, len(configs))
    for i, (n, rate) in enumerate(configs):
        ys = []
        for m in methods:
            r = next((x for x in runs if x["method"] == m and x.get("rate") == rate
                      and x.get("ranks") == n and "error" not in x), None)
            ys.append(1e3 * r["step_time_median_s"] if r else 0.0)
        ax.bar([k + i * width for k in range(len(methods))], ys, width, label=f"{n} ranks, {rate}")
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(methods))])
    ax.set_xticklabels([method_args(m)[1] for m in methods], rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("time per step (ms, median)")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", default=os.path.join(REPO, "build"))
    p.add_argument("--out", default=os.path.join(REPO, "bench-out", "comm_bound"))
    p.add_argument("--ranks", type=int, default=4, help="hosts (one rank each), phase 1")
    p.add_argument("--rate", default="100mbit", help="link rate, tc syntax, phase 1")
    p.add_argument("--methods", nargs="*", default=ACCURACY_METHODS,
                   help="phase 1's methods (none given: no phase 1)")
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--max-steps", type=int, default=0, help="cap per run (0: --epochs)")
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--test-images", type=int, default=10000)
    p.add_argument("--target-accuracy", type=float, default=0.88)
    p.add_argument("--matrix", action="store_true", help="also run phase 2 (step times)")
    p.add_argument("--matrix-methods", nargs="+", default=MATRIX_METHODS)
    p.add_argument("--matrix-ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--matrix-rates", nargs="+", default=["100mbit", "1gbit"])
    p.add_argument("--matrix-steps", type=int, default=40)
    p.add_argument("--sweep", action="store_true", help="also run phase 3 (all-reduce sweep)")
    p.add_argument("--sweep-min", default="4K")
    p.add_argument("--sweep-max", default="64M")
    p.add_argument("--sweep-iters", type=int, default=5)
    p.add_argument("--run-timeout", type=float, default=3600)
    p.add_argument("--from-json", nargs="+", metavar="RESULTS",
                   help="run nothing: merge these results.json files and write the report")
    p.add_argument("--smoke", action="store_true",
                   help="CI: 2 hosts, a few steps per method, a 1-configuration matrix")
    args = p.parse_args(argv)
    if args.smoke:
        args.ranks, args.max_steps, args.eval_every, args.test_images = 2, 6, 3, 500
        args.matrix, args.matrix_ranks, args.matrix_rates = True, [2], [args.rate]
        args.matrix_methods, args.matrix_steps, args.run_timeout = ["none", "ddp-fp16"], 6, 300
        args.sweep, args.sweep_min, args.sweep_max, args.sweep_iters = True, "4K", "64K", 2
    return args


def recorded_args(args):
    """The arguments as results.json records them: the build and output folders relative to
    the repository when inside it, else by their last component only, so that results
    committed to the repository name no path of the machine that produced them."""
    def recorded(path):
        full = os.path.abspath(path)
        if full == REPO or full.startswith(REPO + os.sep):
            return os.path.relpath(full, REPO)
        return os.path.basename(full.rstrip(os.sep))
    return dict(vars(args), build_dir=recorded(args.build_dir), out=recorded(args.out))


def check_setup(args):
    if os.geteuid() != 0:
        sys.exit("comm_bound_bench: needs root (network namespaces, tc)")
    for tool in ("ip", "tc", "unshare", "nsenter", "sshd", "ssh-keygen"):
        if shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin") is None:
            sys.exit(f"comm_bound_bench: '{tool}' not found (scripts/install_deps.sh --tests)")
    if not os.path.exists(os.path.join(args.build_dir, "tools", "braidrun", "braidrun")):
        sys.exit(f"comm_bound_bench: no braidrun in {args.build_dir} (scripts/build.sh)")


def run_phase(args, n, rate, methods, extra):
    runs = []
    with HostSet(n, rate) as hosts:
        for m in methods:
            rec = hosts.run_job(os.path.abspath(args.build_dir), m, extra, args.run_timeout)
            rec.setdefault("ranks", n)
            rec.setdefault("rate", rate)
            status = rec.get("error") or (f"{1e3 * rec['step_time_median_s']:.1f} ms/step, "
                                          f"accuracy {100 * rec['final_test_accuracy']:.2f}%")
            print(f"  {n} ranks {rate} {rec['label']}: {status}", flush=True)
            runs.append(rec)
    return runs


def merged_results(paths):
    """The runs of several results.json files, and the matrix configurations they cover."""
    merged = {"accuracy_runs": [], "matrix_runs": [], "sweep": []}
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        for key in ("accuracy_runs", "matrix_runs", "sweep"):
            merged[key] += doc.get(key, [])
        merged.setdefault("args", doc.get("args", {}))
    configs = list(dict.fromkeys((r["ranks"], r["rate"]) for r in merged["matrix_runs"]))
    return merged, configs


def main(argv=None):
    args = parse_args(argv)
    if args.from_json:
        results, configs = merged_results(args.from_json)
        first = next(iter(results["accuracy_runs"]), None)
        if first:
            args.ranks, args.rate = first["ranks"], first["rate"]
        os.makedirs(args.out, exist_ok=True)
        report(args, results, configs)
        return 0
    check_setup(args)
    os.makedirs(args.out, exist_ok=True)
    results = {"args": recorded_args(args), "accuracy_runs": [], "matrix_runs": []}
    if args.methods:
        print(f"phase 1: {args.ranks} hosts at {args.rate}, time to "
              f"{100 * args.target_accuracy:g}% test accuracy", flush=True)
        extra = ["--epochs", str(args.epochs), "--eval-every", str(args.eval_every),
                 "--test-images", str(args.test_images)]
        if args.max_steps:
            extra += ["--max-steps", str(args.max_steps)]
        results["accuracy_runs"] = run_phase(args, args.ranks, args.rate, args.methods, extra)
    configs = [(n, rate) for n in args.matrix_ranks for rate in args.matrix_rates]
    if args.matrix:
        print("phase 2: step times", flush=True)
        extra = ["--max-steps", str(args.matrix_steps), "--warmup-steps",
                 str(min(5, args.matrix_steps // 3)), "--eval-every", "0", "--test-images", "500"]
        for n, rate in configs:
            results["matrix_runs"] += run_phase(args, n, rate, args.matrix_methods, extra)
    results["sweep"] = []
    if args.sweep:
        print("phase 3: all-reduce sweep", flush=True)
        for rate in args.matrix_rates:
            with HostSet(args.ranks, rate) as hosts:
                results["sweep"] += run_sweep(args, hosts, os.path.abspath(args.build_dir))
    report(args, results, configs)
    failed = [r for r in results["accuracy_runs"] + results["matrix_runs"] + results["sweep"]
              if "error" in r]
    return 1 if failed else 0


def report(args, results, configs):
    title = (f"{args.ranks} ranks, one per host, {args.rate} links: Fashion-MNIST CNN, "
             f"{32 * args.ranks} images/step")
    lines = []
    if results["accuracy_runs"]:
        lines += [f"### Time to accuracy ({title})", ""]
        lines += accuracy_table(results["accuracy_runs"], args.target_accuracy)
        plot_accuracy(results["accuracy_runs"],
                      os.path.join(args.out, f"accuracy_{args.ranks}x{args.rate}.png"), title,
                      args.target_accuracy)
    if results["matrix_runs"]:
        lines += ["", "### Step time (median ms; one rank per host)", ""]
        lines += matrix_table(results["matrix_runs"], configs)
        plot_steps(results["matrix_runs"], configs, os.path.join(args.out, "steps.png"))
        floor = floor_table(results["matrix_runs"], configs)
        if len(floor) > 2:
            lines += ["", "### Against the floor (uncompressed methods)", ""] + floor
    if results["sweep"]:
        lines += ["", "### All-reduce sweep (float32 sum, in place, one rank per host; nccl-tests "
                      "method: busbw = algbw x 2(n-1)/n)"]
        lines += sweep_table(results["sweep"])
        plot_sweep(results["sweep"], os.path.join(args.out, "sweep.png"))
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
