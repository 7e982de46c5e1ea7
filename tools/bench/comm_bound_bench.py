#!/usr/bin/python3
"""comm_bound_bench.py: training when the network is the bottleneck, braid vs PyTorch DDP.

    sudo /usr/bin/python3 tools/bench/comm_bound_bench.py --build-dir build \\
        --out bench-out/comm_bound [--ranks 4] [--rate 100mbit] [--epochs 3] [--matrix]

One rank per test host (tools/testhosts/braid-testhosts: network namespaces with their own
hostname, PID and IPC namespaces, joined through a bridge by links rate-limited with tc), so
every gradient crosses a link of the configured rate; the ranks start over ssh (braidrun -H,
also for DDP: braidrun launches any command). Needs root.

Workloads (--workload; tools/bench/comm_bound_rank.py trains them as their examples do):

- fmnist (default): examples/train_fashion_mnist.py's CNN (215k float32 parameters, 861 KB
  of gradients a step) at 32 images per rank per step, scored by test accuracy (target
  --target-accuracy, 88%). Its computation is a few milliseconds a step while an
  uncompressed ring all-reduce of 861 KB over 4 ranks moves 2(n-1)/n x 861 KB = 1.29 MB of
  payload per rank, about 103 ms at 100 Mbit/s (108 ms in Ethernet frames, what the floor
  below counts).
- lm: examples/train_language_model.py's LSTM language model on the King James Bible (5.66M
  float32 parameters, 22.6 MB of gradients a step, most of them in the 10,000-word embedding
  and softmax) at 20 x 35 tokens per rank per step, scored by validation perplexity on the
  held-out chapters (target --target-perplexity, 120). At 4 ranks and
  100 Mbit/s a ring all-reduce moves 34 MB per rank, about 2.8 s, against a few hundred
  milliseconds of computation.

Both steps are communication-bound: the table's "comm share" measures it (1 - the step time
with no communication, `local`, over the method's step time).

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

Output in --out: results.json (every run, written after each), table.md (the tables below,
as printed), and PNG plots: accuracy_<ranks>x<rate>.png (test accuracy or validation
perplexity against training time, one line per method), steps.png (phase 2's step times)
and sweep.png (phase 3's busbw).

A whole matrix takes hours: run it in parts. --resume keeps the runs --out's results.json
already holds (those that did not fail) and runs only the others, so an interrupted run
goes on where it stopped; --from-json merges the results.json of several parts (each
part's runs carry when they ran and the load average before they started) into one report. Figures are medians of one run each on a
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
# The language model's target: validation perplexity on the held-out chapters, as
# examples/train_language_model.py's default (BENCHMARKS.md, section 28, says how it was
# chosen).
LM_TARGET_PERPLEXITY = 120.0
# Per workload: the rank program's score (and whether higher is better), its axis label,
# and phase 1's defaults.
WORKLOADS = {
    "fmnist": {"metric": "test_accuracy", "higher": True, "label": "test accuracy (%)",
               "scale": 100.0, "epochs": 3.0, "eval_every": 50,
               "title": "Fashion-MNIST CNN, {images} images/step"},
    "lm": {"metric": "valid_perplexity", "higher": False, "label": "validation perplexity",
           "scale": 1.0, "epochs": 1.0, "eval_every": 25,
           "title": "LSTM language model, {tokens} tokens/step"},
}
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
        """Runs one job from h0; returns rank 0's RESULT record (with its label and rate, when
        it started and the load average then)."""
        args, label = method_args(method)
        cmd = self.braidrun(build, [PYTHON, RANK_PROGRAM, *args, *extra])
        started = {"started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                   "load_before": round(os.getloadavg()[0], 2)}
        start = time.monotonic()
        try:
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               timeout=timeout, cwd=REPO)
        except subprocess.TimeoutExpired:
            return {"method": method, "label": label, "error": f"timed out after {timeout} s",
                    **started}
        for line in r.stdout.splitlines():
            if line.startswith("[0] RESULT "):
                rec = json.loads(line[len("[0] RESULT "):])
                rec.update(method=method, label=label, rate=self.rate,
                           job_seconds=time.monotonic() - start, **started)
                # What a job changed while it ran (compression auto's choices, autotuning's
                # candidates): rank 0 logs each as it applies it.
                rec["settings_changes"] = [
                    ln.split("braid: settings ", 1)[1]
                    for ln in (r.stdout + r.stderr).splitlines()
                    if ln.startswith("[0] ") and "braid: settings epoch" in ln]
                # Compression auto's choices in the label: "braid auto (fp4:ef=1 from step 12)".
                chosen = [re.search(r"from step (\d+): .*auto compression=(\S+) ", c)
                          for c in rec["settings_changes"]]
                chosen = [f"{m.group(2)} from step {m.group(1)}" for m in chosen if m]
                if chosen:
                    rec["label"] = f"{label} ({', '.join(chosen)})"
                return rec
        lines = (r.stdout + r.stderr).splitlines()
        # The first error lines of any rank first: the rank that failed first is often not the
        # one whose lines come last (a survivor reports the peer that left).
        first = [ln for ln in lines if FIRST_ERROR.search(ln)][:8]
        tail = "\n".join(lines[-60:])
        return {"method": method, "label": label, **started,
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


def workloads_of(doc):
    """The workloads of a results document's runs (older results are all fmnist)."""
    return {r.get("workload", "fmnist") for r in
            doc.get("accuracy_runs", []) + doc.get("matrix_runs", [])}


def time_to(history, target, workload="fmnist"):
    """The training time at the first score that reaches target (at or above it for an
    accuracy, at or below for a perplexity); None if none does."""
    w = WORKLOADS[workload]
    for h in history:
        v = h[w["metric"]]
        if (v >= target) if w["higher"] else (v <= target):
            return h["train_time_s"]
    return None


def metric_text(value, workload):
    return f"{100 * value:.2f}%" if WORKLOADS[workload]["higher"] else f"{value:.1f}"


def accuracy_table(runs, target, workload="fmnist"):
    """Markdown rows of phase 1, with the communication share and speed-ups."""
    w = WORKLOADS[workload]
    local = next((r for r in runs if r["method"] == "local" and "error" not in r), None)
    base = {r["method"]: r for r in runs if "error" not in r}
    ref = time_to(base["none"]["history"], target, workload) if "none" in base else None
    goal = f"{100 * target:g}%" if w["higher"] else f"perplexity {target:g}"
    final = "final accuracy" if w["higher"] else "final perplexity"
    lines = [f"| method | time/step (ms) | comm share | time to {goal} (s) | "
             f"vs braid none | {final} | wire MB/step (all ranks) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        if "error" in r:
            lines.append(f"| {r['label']} | failed: {r['error'].splitlines()[0]} | | | | | |")
            continue
        step = r["step_time_median_s"]
        share = (f"{100 * max(0.0, 1 - local['step_time_median_s'] / step):.0f}%"
                 if local and r is not local else "")
        if r["method"] == "local":
            # Each rank trains alone on its shard and rank 0 scores its part of the held-out
            # set: its step time is the computation's, its score compares with nothing.
            lines.append(f"| {r['label']} | {1e3 * step:.1f} | | - | | - | "
                         f"{r['wire_bytes'] / r['steps'] / 1e6:.3f} |")
            continue
        t = time_to(r["history"], target, workload)
        speed = f"{ref / t:.2f}x" if (t and ref) else ""
        lines.append(
            f"| {r['label']} | {1e3 * step:.1f} | {share} | "
            f"{f'{t:.1f}' if t is not None else 'not reached'} | {speed} | "
            f"{metric_text(r['history'][-1][w['metric']], workload)} | "
            f"{r['wire_bytes'] / r['steps'] / 1e6:.3f} |")
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


def plot_accuracy(runs, path, title, target, workload="fmnist"):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    w = WORKLOADS[workload]
    fig, ax = plt.subplots(figsize=(8, 5))
    goal = w["scale"] * target
    lowest = highest = goal
    for r in runs:
        if "error" in r or r["method"] == "local":
            continue
        xs = [h["train_time_s"] for h in r["history"]]
        ys = [w["scale"] * h[w["metric"]] for h in r["history"]]
        # The first scores are often near chance (or a perplexity in the thousands): let
        # them go off the axis.
        lowest, highest = min([lowest] + ys[1:]), max([highest] + ys[-3:])
        ax.plot(xs, ys, marker=".", label=r["label"],
                linestyle="--" if r["framework"] == "ddp" else "-")
    ax.axhline(goal, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("training time (s, wall clock, evaluation excluded)")
    ax.set_ylabel(w["label"])
    ax.set_title(title)
    if w["higher"]:
        ax.set_ylim(bottom=max(0.0, lowest - 5), top=100)
    else:
        ax.set_ylim(bottom=0.8 * lowest, top=2.0 * highest)
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
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="fmnist",
                   help="fmnist (the CNN) or lm (the language model)")
    p.add_argument("--ranks", type=int, default=4, help="hosts (one rank each), phase 1")
    p.add_argument("--rate", default="100mbit", help="link rate, tc syntax, phase 1")
    p.add_argument("--methods", nargs="*", default=ACCURACY_METHODS,
                   help="phase 1's methods (none given: no phase 1)")
    p.add_argument("--epochs", type=float, default=None,
                   help="epochs per run (default: fmnist 3, lm 1)")
    p.add_argument("--max-steps", type=int, default=0, help="cap per run (0: --epochs)")
    p.add_argument("--eval-every", type=int, default=None,
                   help="score every N steps (default: fmnist 50, lm 25)")
    p.add_argument("--seed", type=int, default=0,
                   help="initial weights and data order, the same for every method (another "
                        "seed: another --out)")
    p.add_argument("--test-images", type=int, default=10000, help="fmnist: images scored")
    p.add_argument("--valid-tokens", type=int, default=0,
                   help="lm: held-out tokens scored (0: all 46,116)")
    p.add_argument("--target-accuracy", type=float, default=0.88, help="fmnist's target")
    p.add_argument("--target-perplexity", type=float, default=LM_TARGET_PERPLEXITY,
                   help="lm's target")
    p.add_argument("--resume", action="store_true",
                   help="keep the runs --out/results.json holds that did not fail; run the rest")
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
    w = WORKLOADS[args.workload]
    if args.epochs is None:
        args.epochs = w["epochs"]
    if args.eval_every is None:
        args.eval_every = w["eval_every"]
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


def target_of(args):
    return args.target_accuracy if args.workload == "fmnist" else args.target_perplexity


def write_results(args, results):
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)


def run_phase(args, n, rate, methods, extra, results, key):
    """Runs each method on n hosts at rate, appending its record to results[key] and writing
    results.json after each; with --resume, a method whose record for (n, rate) is already
    there without an error is kept and not run again."""
    def config(r):
        return r["method"], r.get("ranks"), r.get("rate")

    done = {config(r) for r in results[key] if "error" not in r}
    todo = [m for m in methods if (m, n, rate) not in done]
    for m in methods:
        if m not in todo:
            print(f"  {n} ranks {rate} {method_args(m)[1]}: kept from an earlier run", flush=True)
    if not todo:
        return
    # A failed record of an earlier run is replaced by this run's.
    again = {(m, n, rate) for m in todo}
    results[key] = [r for r in results[key] if not ("error" in r and config(r) in again)]
    w = WORKLOADS[args.workload]
    with HostSet(n, rate) as hosts:
        for m in todo:
            rec = hosts.run_job(os.path.abspath(args.build_dir), m,
                                ["--workload", args.workload, *extra], args.run_timeout)
            rec.setdefault("ranks", n)
            rec.setdefault("rate", rate)
            rec.setdefault("workload", args.workload)
            status = rec.get("error") or (
                f"{1e3 * rec['step_time_median_s']:.1f} ms/step, {w['label']} "
                f"{metric_text(rec['history'][-1][w['metric']], args.workload)}")
            print(f"  {n} ranks {rate} {rec['label']}: {status}", flush=True)
            results[key].append(rec)
            write_results(args, results)


def merged_results(paths):
    """The runs of several results.json files, and the matrix configurations they cover.
    ValueError if one cannot be read, is not this tool's, or they hold different workloads."""
    merged = {"accuracy_runs": [], "matrix_runs": [], "sweep": []}
    for path in paths:
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: {e}") from e
        if not isinstance(doc, dict) or not any(k in doc for k in merged):
            raise ValueError(f"{path} is not a results.json of comm_bound_bench.py (it has "
                             "none of accuracy_runs, matrix_runs, sweep)")
        for key in ("accuracy_runs", "matrix_runs", "sweep"):
            merged[key] += doc.get(key, [])
        merged.setdefault("args", doc.get("args", {}))
    workloads = workloads_of(merged)
    if len(workloads) > 1:
        raise ValueError(f"these results hold several workloads ({sorted(workloads)}): "
                         "merge each workload's apart")
    configs = list(dict.fromkeys((r["ranks"], r["rate"]) for r in merged["matrix_runs"]))
    return merged, configs


def main(argv=None):
    args = parse_args(argv)
    if args.from_json:
        try:
            results, configs = merged_results(args.from_json)
        except ValueError as e:
            sys.exit(f"comm_bound_bench: {e}")
        runs = results["accuracy_runs"] + results["matrix_runs"]
        if runs:
            args.workload = runs[0].get("workload", "fmnist")
        first = next(iter(results["accuracy_runs"]), None)
        if first:
            args.ranks, args.rate = first["ranks"], first["rate"]
        os.makedirs(args.out, exist_ok=True)
        report(args, results, configs)
        return 0
    check_setup(args)
    os.makedirs(args.out, exist_ok=True)
    results = {"args": recorded_args(args), "accuracy_runs": [], "matrix_runs": [], "sweep": []}
    path = os.path.join(args.out, "results.json")
    if args.resume and os.path.exists(path):
        with open(path) as f:
            earlier = json.load(f)
        kinds = workloads_of(earlier)
        if kinds - {args.workload}:
            sys.exit(f"comm_bound_bench: {path} holds {sorted(kinds)} runs, not "
                     f"{args.workload}: use another --out")
        if earlier.get("args", {}).get("seed", 0) != args.seed:
            sys.exit(f"comm_bound_bench: {path} holds runs of seed "
                     f"{earlier['args'].get('seed', 0)}, not {args.seed}: use another --out")
        # What else a run's record depends on (the ranks and rate are in each record's key).
        theirs = earlier.get("args", {})
        differ = [f"--{k.replace('_', '-')} {theirs[k]}, not {getattr(args, k)}"
                  for k in ("epochs", "max_steps", "eval_every", "test_images", "valid_tokens")
                  if k in theirs and theirs[k] != getattr(args, k)]
        if differ:
            sys.exit(f"comm_bound_bench: {path} holds runs of other settings "
                     f"({'; '.join(differ)}): use another --out")
        for key in ("accuracy_runs", "matrix_runs", "sweep"):
            results[key] = earlier.get(key, [])
    extra_eval = (["--test-images", str(args.test_images)] if args.workload == "fmnist"
                  else ["--valid-tokens", str(args.valid_tokens)])
    if args.methods:
        goal = (f"{100 * args.target_accuracy:g}% test accuracy" if args.workload == "fmnist"
                else f"validation perplexity {args.target_perplexity:g}")
        print(f"phase 1: {args.ranks} hosts at {args.rate}, time to {goal}", flush=True)
        extra = ["--epochs", str(args.epochs), "--eval-every", str(args.eval_every),
                 "--seed", str(args.seed), *extra_eval]
        if args.max_steps:
            extra += ["--max-steps", str(args.max_steps)]
        run_phase(args, args.ranks, args.rate, args.methods, extra, results, "accuracy_runs")
    configs = [(n, rate) for n in args.matrix_ranks for rate in args.matrix_rates]
    if args.matrix:
        print("phase 2: step times", flush=True)
        extra = ["--max-steps", str(args.matrix_steps), "--warmup-steps",
                 str(min(5, args.matrix_steps // 3)), "--eval-every", "0",
                 *(["--test-images", "500"] if args.workload == "fmnist"
                   else ["--valid-tokens", "2000"])]
        for n, rate in configs:
            run_phase(args, n, rate, args.matrix_methods, extra, results, "matrix_runs")
    if args.sweep:
        print("phase 3: all-reduce sweep", flush=True)
        results["sweep"] = []
        for rate in args.matrix_rates:
            with HostSet(args.ranks, rate) as hosts:
                results["sweep"] += run_sweep(args, hosts, os.path.abspath(args.build_dir))
    configs = list(dict.fromkeys(configs + [(r["ranks"], r["rate"])
                                            for r in results["matrix_runs"]]))
    report(args, results, configs)
    failed = [r for r in results["accuracy_runs"] + results["matrix_runs"] + results["sweep"]
              if "error" in r]
    return 1 if failed else 0


def report(args, results, configs):
    w = WORKLOADS[args.workload]
    title = (f"{args.ranks} ranks, one per host, {args.rate} links: " + w["title"].format(
        images=32 * args.ranks, tokens=20 * 35 * args.ranks))
    target = target_of(args)
    lines = []
    if results["accuracy_runs"]:
        lines += [f"### Time to {'accuracy' if w['higher'] else 'perplexity'} ({title})", ""]
        lines += accuracy_table(results["accuracy_runs"], target, args.workload)
        plot_accuracy(results["accuracy_runs"],
                      os.path.join(args.out, f"accuracy_{args.ranks}x{args.rate}.png"), title,
                      target, args.workload)
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
    write_results(args, results)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
