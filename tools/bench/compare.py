#!/usr/bin/python3
"""compare.py: braid's all-reduce next to Open MPI's and gloo's on this host, in one run.

    /usr/bin/python3 tools/bench/compare.py --build-dir build -b 4 -e 64M -f 4 --ranks 2 \\
        --repeat 2 --json compare.json --markdown compare.md

Peers (all float32 sum all-reduce, same sizes, iterations, warm-up and method: nccl-tests):
  braid-shm    braid-bench, UCX_TLS=sm UCX_NET_DEVICES=lo (sysv for small, cma for large)
  braid-tcp    braid-bench, UCX_TLS=tcp UCX_NET_DEVICES=lo
  openmpi-shm  mpi-allreduce-bench under mpirun --mca pml ob1 --mca btl self,vader
  openmpi-tcp  mpi-allreduce-bench under mpirun --mca pml ob1 --mca btl self,tcp
               --mca btl_tcp_if_include lo
  gloo         gloo_bench.py (torch.distributed, gloo over TCP on lo; gloo has no shm path)
Open MPI runs with the ob1 PML so the chosen BTL is what moves the bytes (Debian's Open MPI
would otherwise pick its UCX PML) and with --bind-to none, as braid and gloo do not bind.

Noise: the peers run one after another in rounds, the order rotating every round, so a
disturbance on this 2-core machine hits every peer alike; each peer runs --repeat times and
the table shows, per size, the median over runs of the time (max over ranks of the mean per
iteration) and the busbw of that time. Ratios are braid's speed over the other's
(time_other / time_braid: > 1 means braid is faster). Rows compared are in place by default
(torch's all_reduce is in place only); --placement out-of-place uses out-of-place rows where
a peer has them.

Before and after: --base REV also runs braid-bench built from git revision REV (exported
with `git archive` and built into --base-build-dir, default build/base/<sha>, once) as the
peers base-shm and base-tcp, interleaved with this build's runs in the same rounds:

    /usr/bin/python3 tools/bench/compare.py --build-dir build --base ffc1e13 --repeat 5 \
        -b 4 -e 64M -f 4 --ranks 2 --json before_after.json --markdown before_after.md

It then prints a before/after table: per size and transport, the median time of each side
with its spread (min-max over the runs), the ratio before/after (> 1: this build faster) and a
verdict: "slower" only when every run of this build was slower than every run of the base
(the ranges do not overlap), "faster" likewise, else "within spread".

A peer that fails, hangs past --run-timeout, or is not built is reported and skipped; the exit
code is 1 when a braid run failed or any peer reported wrong elements, else 0.
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PYTHON = "/usr/bin/python3"  # Debian's, with torch (a python3 earlier on PATH may lack it)

# Background CPU use (fraction of all CPUs) above which the timings are flagged unreliable.
BUSY_WARN = 0.15

VARIANTS = ["braid-shm", "braid-tcp", "openmpi-shm", "openmpi-tcp", "gloo", "base-shm",
            "base-tcp"]
DEFAULT_PEERS = ["braid-shm", "braid-tcp", "openmpi-shm", "openmpi-tcp", "gloo"]
BEFORE_AFTER_PEERS = ["braid-shm", "base-shm", "braid-tcp", "base-tcp"]
# (braid variant, other variant, short label) whose speed ratio the table shows.
RATIOS = [("braid-shm", "openmpi-shm", "shm/ompi"), ("braid-tcp", "openmpi-tcp", "tcp/ompi"),
          ("braid-shm", "gloo", "shm/gloo"), ("braid-tcp", "gloo", "tcp/gloo"),
          ("braid-shm", "base-shm", "shm/base"), ("braid-tcp", "base-tcp", "tcp/base")]
# (this build, base build, label) of the before/after table.
BEFORE_AFTER = [("braid-shm", "base-shm", "shm"), ("braid-tcp", "base-tcp", "tcp")]


def default_build_dir():
    for d in ("build-bench", "build"):
        if os.path.exists(os.path.join(REPO, d, "tools", "bench", "braid-bench")):
            return os.path.join(REPO, d)
    return os.path.join(REPO, "build")


def human_size(n):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= (1 << shift) and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def peer_commands(args, variant, json_path):
    """(argv, extra env) for one run of `variant`, or None when it is not built."""
    sweep = ["-b", args.minbytes, "-e", args.maxbytes, "-f", args.stepfactor,
             "-n", str(args.iters), "-w", str(args.warmup), "-c", str(args.check)]
    deadline = str(max(30, args.run_timeout - 10))
    bench_dir = os.path.join(args.build_dir, "tools", "bench")
    if variant.startswith("braid") or variant.startswith("base"):
        exe = (os.path.join(bench_dir, "braid-bench") if variant.startswith("braid")
               else args.base_bench)
        if not exe or not os.access(exe, os.X_OK):
            return None
        tls = "sm" if variant.endswith("-shm") else "tcp"
        return ([exe, "allreduce", *sweep, "--ranks", str(args.ranks), "--json", json_path,
                 "--deadline", deadline, "--timeout", str(args.timeout)],
                {"UCX_TLS": tls, "UCX_NET_DEVICES": "lo"})
    if variant.startswith("openmpi"):
        exe = os.path.join(bench_dir, "mpi-allreduce-bench")
        mpirun = shutil.which("mpirun")
        if not os.access(exe, os.X_OK) or mpirun is None:
            return None
        btl = (["--mca", "btl", "self,vader"] if variant == "openmpi-shm" else
               ["--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo"])
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        return ([mpirun, *root, "--oversubscribe", "--bind-to", "none", "-np", str(args.ranks),
                 "--mca", "pml", "ob1", *btl, exe, *sweep, "--json", json_path],
                {"OMPI_MCA_pml": "ob1"})
    if variant == "gloo":
        return ([PYTHON, os.path.join(HERE, "gloo_bench.py"), *sweep, "--ranks", str(args.ranks),
                 "--json", json_path, "--deadline", deadline, "--timeout", str(args.timeout)],
                {"GLOO_SOCKET_IFNAME": "lo"})
    raise ValueError(variant)


def _cpu_times():
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields), idle


def background_busy(interval=0.25):
    """Fraction of all CPUs busy over `interval` while no peer runs: other processes' load.
    On a 2-core machine anything well above 0 skews every timing."""
    try:
        total0, idle0 = _cpu_times()
        time.sleep(interval)
        total1, idle1 = _cpu_times()
    except (OSError, ValueError, IndexError):
        return None
    return 1.0 - (idle1 - idle0) / max(1, total1 - total0)


def wait_idle(limit_s):
    """Waits up to `limit_s` for the CPUs to be idle (other processes' use < BUSY_WARN)."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        busy = background_busy(0.5)
        if busy is None or busy < BUSY_WARN:
            return


def build_base(rev, base_dir, target="braid-bench"):
    """Exports git revision `rev` of this repository into `base_dir`/src and builds its
    benchmark `target` (tools/bench) into `base_dir`/build (once: an existing binary is
    reused). Returns the binary's path and the commit; raises RuntimeError with the failing
    command's output. e2e_compare.py builds braid-e2e-bench with it."""
    sha = subprocess.run(["git", "-C", REPO, "rev-parse", "--verify", rev + "^{commit}"],
                         capture_output=True, text=True)
    if sha.returncode != 0:
        raise RuntimeError(f"--base {rev}: not a commit of {REPO}: {sha.stderr.strip()}")
    sha = sha.stdout.strip()
    # Under build/, which git and Bazel ignore (the export has BUILD files of its own).
    base_dir = base_dir or os.path.join(REPO, "build", "base", sha[:12])
    src, build = os.path.join(base_dir, "src"), os.path.join(base_dir, "build")
    exe = os.path.join(build, "tools", "bench", target)
    if os.access(exe, os.X_OK):
        return exe, sha
    os.makedirs(src, exist_ok=True)
    archive = subprocess.Popen(["git", "-C", REPO, "archive", sha], stdout=subprocess.PIPE)
    untar = subprocess.run(["tar", "-x", "-C", src], stdin=archive.stdout)
    archive.stdout.close()
    if archive.wait() != 0 or untar.returncode != 0:
        raise RuntimeError(f"git archive {sha} | tar -x -C {src} failed")
    # The same compiler cache as scripts/build.sh, so a base close to this build is quick.
    env = dict(os.environ, CCACHE_BASEDIR=src, CCACHE_NOHASHDIR="true")
    for cmd in (["cmake", "-S", src, "-B", build, "-G", "Ninja",
                 "-DPython3_EXECUTABLE=" + PYTHON, "-DBRAID_BUILD_TESTS=OFF"],
                ["cmake", "--build", build, "--target", target]):
        print("# " + " ".join(cmd), flush=True)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return exe, sha


def run_peer(args, variant, round_index, workdir):
    """Runs one peer once. Returns a record: variant, round, ok, error, rc, seconds, doc."""
    if args.wait_idle > 0:
        wait_idle(args.wait_idle)
    json_path = os.path.join(workdir, f"{variant}.{round_index}.json")
    log_path = os.path.join(workdir, f"{variant}.{round_index}.log")
    rec = {"variant": variant, "round": round_index, "ok": False, "error": None, "rc": None,
           "seconds": 0.0, "doc": None, "log": log_path, "busy_before": background_busy()}
    cmd = peer_commands(args, variant, json_path)
    if cmd is None:
        rec["error"] = "not built (or mpirun missing): skipped"
        rec["skipped"] = True
        return rec
    argv, extra_env = cmd
    if args.nice:
        argv = ["nice", "-n", str(args.nice), *argv]  # the ranks inherit it
    env = dict(os.environ)
    env.update(extra_env)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    start = time.monotonic()
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(f"{k}={v}" for k, v in extra_env.items()) + " "
                  + " ".join(argv) + "\n")
        log.flush()
        # A session of its own, so a timeout kills mpirun's ranks too.
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            rec["rc"] = proc.wait(timeout=args.run_timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rec["error"] = f"no result within --run-timeout {args.run_timeout}s (killed)"
    rec["seconds"] = time.monotonic() - start
    if os.path.exists(json_path):
        try:
            with open(json_path) as f:
                rec["doc"] = json.load(f)
        except (OSError, ValueError) as e:
            rec["error"] = rec["error"] or f"unreadable JSON {json_path}: {e}"
    if rec["error"] is None:
        if rec["rc"] != 0:
            rec["error"] = f"exit code {rec['rc']}"
        elif rec["doc"] is None:
            rec["error"] = "no JSON written"
        elif not rec["doc"].get("ok", True):
            rec["error"] = rec["doc"].get("error", "run reported failure")
    rec["ok"] = rec["error"] is None
    if not rec["ok"]:
        rec["error"] += "; log tail: " + " | ".join(tail(log_path, 4))
    return rec


def tail(path, n):
    try:
        with open(path, errors="replace") as f:
            return [line.rstrip() for line in f.readlines()[-n:]]
    except OSError:
        return []


def pick_rows(doc, placement):
    """{bytes: row} of one run, preferring `placement`; a peer without it gives the other."""
    want_inplace = placement == "in-place"
    by_size = {}
    for row in (doc or {}).get("rows", []):
        b = row["bytes"]
        if b not in by_size or (row["inplace"] == want_inplace
                                and by_size[b]["inplace"] != want_inplace):
            by_size[b] = row
    return by_size


def summarize(records, placement, stat="mean"):
    """{variant: {bytes: {time_us, busbw_gbps, ...}}}: per size, the median over runs of each
    run's time (`stat` "mean": nccl-tests' mean per iteration; "median": the median
    iteration, which shrugs off a descheduled rank on a busy machine)."""
    key = "time_us" if stat == "mean" else "time_us_median"
    samples = {}
    for rec in records:
        for b, row in pick_rows(rec["doc"], placement).items():
            samples.setdefault(rec["variant"], {}).setdefault(b, []).append(row)
    out = {}
    for variant, sizes in samples.items():
        for b, rows in sizes.items():
            times = [r[key] for r in rows]
            t = statistics.median(times)
            # busbw of the median time: the busbw factor is the same for every run of a size.
            factor = rows[0]["busbw_gbps"] / rows[0]["algbw_gbps"] if rows[0]["algbw_gbps"] else 0
            algbw = b / (t * 1e-6) / 1e9 if t > 0 else 0.0
            wrong = [r["wrong"] for r in rows if r.get("wrong") is not None]
            out.setdefault(variant, {})[b] = {
                "time_us": t, "algbw_gbps": algbw, "busbw_gbps": algbw * factor,
                "time_us_min": min(times), "time_us_max": max(times), "runs": len(rows),
                "inplace": rows[0]["inplace"], "wrong": sum(wrong) if wrong else None}
    return out


def ratio(summary, a, b, size):
    ra, rb = summary.get(a, {}).get(size), summary.get(b, {}).get(size)
    if not ra or not rb or ra["time_us"] <= 0:
        return None
    return rb["time_us"] / ra["time_us"]


def table_lines(summary, variants, sizes, markdown):
    ratios = [x for x in RATIOS if x[0] in variants and x[1] in variants]
    cols = ["size"]
    for v in variants:
        cols += [f"{v} busbw", f"{v} us"]
    cols += [f"{a}/{b}" for a, b, _ in ratios]
    rows = []
    for size in sizes:
        cells = [human_size(size)]
        for v in variants:
            r = summary.get(v, {}).get(size)
            if r is None:
                cells += ["-", "-"]
            else:
                mark = "!" if r["wrong"] else ""
                cells += [f"{r['busbw_gbps']:.3f}{mark}", f"{r['time_us']:.1f}"]
        for a, b, _ in ratios:
            x = ratio(summary, a, b, size)
            cells.append("-" if x is None else f"{x:.2f}x")
        rows.append(cells)
    if markdown:
        lines = ["| " + " | ".join(cols) + " |",
                 "|" + "|".join("---:" for _ in cols) + "|"]
        lines += ["| " + " | ".join(c) + " |" for c in rows]
        return lines
    # Plain text: two header lines (variant, then metric), fixed widths.
    head1 = [f"{'':>9}"]
    head2 = [f"{'size':>9}"]
    for v in variants:
        head1.append(f"{v:>20}")
        head2.append(f"{'busbw':>9} {'time(us)':>10}")
    for _, _, label in ratios:
        head1.append(f"{'ratio':>9}")
        head2.append(f"{label:>9}")
    lines = ["# " + "  ".join(head1), "# " + "  ".join(head2)]
    for cells in rows:
        parts = ["  " + f"{cells[0]:>9}"]
        for i in range(len(variants)):
            parts.append(f"{cells[1 + 2 * i]:>9} {cells[2 + 2 * i]:>10}")
        parts += [f"{c:>9}" for c in cells[1 + 2 * len(variants):]]
        lines.append("  ".join(parts))
    return lines


def before_after(summary, size):
    """[(label, after, before, ratio, verdict)] for `size`: this build's and the base's rows,
    time_before / time_after (> 1: this build faster), and whether the difference is beyond
    the spread: "slower" / "faster" when the two sides' [min, max] ranges over the runs do
    not overlap, else "within spread" (and no verdict from a single run)."""
    out = []
    for after_v, before_v, label in BEFORE_AFTER:
        a, b = summary.get(after_v, {}).get(size), summary.get(before_v, {}).get(size)
        if not a or not b:
            continue
        if min(a["runs"], b["runs"]) < 2:
            verdict = "one run: no spread"
        elif a["time_us_min"] > b["time_us_max"]:
            verdict = "slower"
        elif a["time_us_max"] < b["time_us_min"]:
            verdict = "faster"
        else:
            verdict = "within spread"
        out.append((label, a, b, ratio(summary, after_v, before_v, size), verdict))
    return out


def before_after_lines(summary, sizes, markdown):
    """The before/after table: per size and transport, median time (min-max over runs) of
    this build and of the base, their ratio and the verdict."""
    labels = [label for a, b, label in BEFORE_AFTER if a in summary and b in summary]
    if not labels:
        return []
    def span(r):
        return f"{r['time_us']:.1f} ({r['time_us_min']:.1f}-{r['time_us_max']:.1f})"
    cols = ["size"]
    for label in labels:
        cols += [f"{label} after us", f"{label} before us", f"{label} before/after",
                 f"{label} verdict"]
    rows = []
    for size in sizes:
        cells = {label: ["-"] * 4 for label in labels}
        for label, a, b, x, verdict in before_after(summary, size):
            cells[label] = [span(a), span(b), "-" if x is None else f"{x:.2f}x",
                            verdict.upper() if verdict == "slower" else verdict]
        rows.append([human_size(size)] + [c for label in labels for c in cells[label]])
    if markdown:
        return (["| " + " | ".join(cols) + " |", "|" + "|".join("---:" for _ in cols) + "|"]
                + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return ["# " + fmt.format(*cols)] + ["  " + fmt.format(*r) for r in rows]


def select_runs(records, max_busy):
    """The runs with results whose medians count: all, or with `max_busy` those that started
    on a quiet enough machine (per variant, at least the least busy one)."""
    with_doc = [x for x in records if x["doc"]]
    if max_busy is None:
        return with_doc
    used = []
    for v in {x["variant"] for x in with_doc}:
        runs = [x for x in with_doc if x["variant"] == v]
        quiet = [x for x in runs if (x.get("busy_before") or 0) <= max_busy]
        used += quiet or [min(runs, key=lambda x: x.get("busy_before") or 0)]
    dropped = len(with_doc) - len(used)
    if dropped:
        print(f"# --max-busy {max_busy}: {dropped} of {len(with_doc)} runs left out "
              f"(started on a busy machine)")
    return used


def load_records(path, variants, round_offset=0):
    """Records of the runs kept in an earlier --json file, as run_peer() returns them; their
    rounds are shifted by `round_offset` so several files can be merged."""
    with open(path) as f:
        old = json.load(f)
    records = []
    for run in old.get("runs", []):
        if run["variant"] not in variants:
            continue
        rows = [r for r in old.get("rows", [])
                if r["variant"] == run["variant"] and r["round"] == run["round"]]
        doc = {"rows": rows, "memcpy_gbps": run.get("memcpy_gbps"),
               "transports": run.get("transports")} if rows or run["ok"] else None
        records.append({"variant": run["variant"], "round": run["round"] + round_offset,
                        "ok": run["ok"],
                        "error": run["error"], "rc": None, "seconds": run.get("seconds", 0),
                        "busy_before": run.get("busy_before"),
                        "doc": doc, "log": None})
    return records, old.get("config", {})


def main(argv=None):
    p = argparse.ArgumentParser(
        description="braid (UCX shm and tcp) vs Open MPI (vader and tcp) vs gloo all-reduce "
                    "on this host, nccl-tests method; see the module docstring",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--build-dir", default=default_build_dir(),
                   help="CMake build dir holding tools/bench/braid-bench and mpi-allreduce-bench")
    p.add_argument("-b", "--minbytes", default="4", help="smallest size (K/M/G suffixes)")
    p.add_argument("-e", "--maxbytes", default="64M", help="largest size")
    p.add_argument("-f", "--stepfactor", default="4", help="size multiplier")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed iterations per size")
    p.add_argument("-w", "--warmup", type=int, default=5, help="warm-up iterations per size")
    p.add_argument("-c", "--check", type=int, default=1, help="check results (count wrong)")
    p.add_argument("--ranks", type=int, default=2, help="ranks per peer run")
    p.add_argument("--repeat", type=int, default=2, help="runs of each peer (medians reported)")
    p.add_argument("--peers",
                   help="comma-separated subset of " + ",".join(VARIANTS) + " (default: "
                        + ",".join(DEFAULT_PEERS) + "; with --base: "
                        + ",".join(BEFORE_AFTER_PEERS) + ")")
    p.add_argument("--base", metavar="REV",
                   help="also run braid-bench built from git revision REV as base-shm and "
                        "base-tcp, interleaved with this build's runs (before/after)")
    p.add_argument("--base-build-dir", metavar="DIR",
                   help="where --base is exported and built (default: build/base/<sha>)")
    p.add_argument("--placement", choices=["in-place", "out-of-place"], default="in-place",
                   help="which rows to compare (gloo has in-place only)")
    p.add_argument("--stat", choices=["mean", "median"], default="mean",
                   help="per-run time: mean per iteration (nccl-tests) or median iteration")
    p.add_argument("--timeout", type=float, default=60,
                   help="per-collective progress timeout given to braid and gloo (s)")
    p.add_argument("--run-timeout", type=float, default=240, help="limit for one peer run (s)")
    p.add_argument("--wait-idle", type=float, default=0, metavar="S",
                   help="before each run, wait up to S seconds for other processes to leave "
                        "the CPUs idle (for shared machines)")
    p.add_argument("--nice", type=int, default=0,
                   help="run every peer at this niceness (e.g. -10 as root, so builds sharing "
                        "the machine yield to the ranks; the same for all peers)")
    p.add_argument("--json", help="write all rows, medians and failures here")
    p.add_argument("--markdown", help="write a Markdown table fragment (for BENCHMARKS.md)")
    p.add_argument("--load", metavar="JSON", action="append",
                   help="run nothing: re-render the runs kept in earlier --json files (repeat "
                        "to merge several), e.g. with another --stat, --placement or --max-busy")
    p.add_argument("--max-busy", type=float, metavar="FRACTION",
                   help="leave out of the medians the runs that started while other processes "
                        "kept more than FRACTION of the CPUs busy (a variant keeps its least "
                        "busy run if all were)")
    p.add_argument("--workdir", help="keep the runs' logs and JSON here (default: a temp dir)")
    args = p.parse_args(argv)
    default = VARIANTS if args.load else BEFORE_AFTER_PEERS if args.base else DEFAULT_PEERS
    peers = args.peers or ",".join(default)
    variants = [v.strip() for v in peers.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        p.error(f"unknown peers {unknown}; choose from {VARIANTS}")
    if args.repeat < 1 or args.ranks < 1:
        p.error("--repeat and --ranks must be >= 1")

    args.base_bench, args.base_sha = None, None
    if args.base and not args.load:
        try:
            args.base_bench, args.base_sha = build_base(args.base, args.base_build_dir)
        except RuntimeError as e:
            print(f"compare.py: {e}", file=sys.stderr)
            return 2
        print(f"# base: {args.base} = {args.base_sha}, {args.base_bench}", flush=True)

    workdir = None
    if not args.load:
        workdir = args.workdir or tempfile.mkdtemp(prefix="braid-compare-")
        os.makedirs(workdir, exist_ok=True)
    t_start = time.monotonic()
    records = []
    for path in args.load or []:
        offset = max((x["round"] for x in records), default=-1) + 1
        loaded, config = load_records(path, variants, offset)
        records += loaded
        for k in ("minbytes", "maxbytes", "stepfactor", "iters", "warmup", "check", "ranks"):
            setattr(args, k, config.get(k, getattr(args, k)))
    for r in range(0 if args.load else args.repeat):
        k = r % len(variants)
        for variant in variants[k:] + variants[:k]:  # rotate the order every round
            rec = run_peer(args, variant, r, workdir)
            records.append(rec)
            status = "ok" if rec["ok"] else ("SKIPPED" if rec.get("skipped") else "FAILED")
            busy = rec["busy_before"]
            print(f"[round {r + 1}/{args.repeat}] {variant:<12} {status:<7} "
                  f"{rec['seconds']:6.1f}s"
                  + ("" if busy is None else f"  (CPUs {busy:4.0%} busy before)")
                  + ("" if rec["ok"] else f"  {rec['error']}"), flush=True)

    used = select_runs(records, args.max_busy)
    counts = [n for n in (sum(1 for x in used if x["variant"] == v) for v in variants) if n]
    rounds = (f"{min(counts)}-{max(counts)}" if counts and min(counts) != max(counts)
              else str(max(counts, default=0)))
    summary = summarize(used, args.placement, args.stat)
    sizes = sorted({b for v in summary.values() for b in v})
    shown = [v for v in variants if v in summary]
    memcpy = [x["doc"].get("memcpy_gbps") for x in used
              if x["doc"] and x["doc"].get("memcpy_gbps")]
    transports = {}
    for x in records:
        if x["doc"] and x["doc"].get("transports"):
            transports.setdefault(x["variant"], set()).add(x["doc"]["transports"])
    failures = [{k: x[k] for k in ("variant", "round", "error", "rc", "log")}
                for x in records if not x["ok"]]
    wrong = {v: sum(s["wrong"] or 0 for s in summary[v].values()) for v in summary}

    print()
    print(f"# all-reduce float32 sum, {args.ranks} ranks, {args.placement}, "
          f"{args.iters} iterations after {args.warmup} warm-up, time = {args.stat} per "
          f"iteration (max over ranks), median of {rounds} runs; "
          f"busbw in GB/s (nccl-tests: algbw * 2(n-1)/n), time in us")
    if memcpy:
        print(f"# memcpy (one thread, 64 MiB): {statistics.median(memcpy):.2f} GB/s "
              f"(median of {len(memcpy)} measurements, one per braid run)")
    for v in variants:
        if v in transports:
            print(f"# {v} transports: {'; '.join(sorted(transports[v]))}")
    print("# ratios: time_other / time_braid (> 1: braid faster); ompi = openmpi")
    for line in table_lines(summary, shown, sizes, markdown=False):
        print(line)
    ba_lines = before_after_lines(summary, sizes, markdown=False)
    if ba_lines:
        print(f"# before/after: base {args.base or '(loaded)'} vs this build; median time of "
              f"{rounds} runs (min-max) in us; before/after = time_base / time_this (> 1: "
              f"this build faster); verdict: slower/faster only beyond the spread")
        for line in ba_lines:
            print(line)
    for v, n in wrong.items():
        if n:
            print(f"# {v}: {n} WRONG elements in total ('!' marks the sizes)")
    for f in failures:
        print(f"# {f['variant']} round {f['round'] + 1}: {f['error']}")
    elapsed = time.monotonic() - t_start
    busy = [x["busy_before"] for x in used if x.get("busy_before") is not None]
    if busy and max(busy) > BUSY_WARN:
        print(f"# WARNING: other processes kept the CPUs up to {max(busy):.0%} busy between "
              f"runs (median {statistics.median(busy):.0%}); timings on this machine are "
              f"unreliable, rerun when it is idle")
    if workdir:
        print(f"# {len(records)} runs in {elapsed:.0f}s; logs in {workdir}")

    if args.json:
        doc = {"config": {k: getattr(args, k) for k in (
                   "minbytes", "maxbytes", "stepfactor", "iters", "warmup", "check", "ranks",
                   "repeat", "placement", "stat", "base", "base_sha")},
               "memcpy_gbps": statistics.median(memcpy) if memcpy else None,
               "transports": {v: sorted(t) for v, t in transports.items()},
               "failures": failures,
               "summary": [{"bytes": b, **{v: summary[v].get(b) for v in shown},
                            "ratios": {f"{a}/{c}": ratio(summary, a, c, b)
                                       for a, c, _ in RATIOS},
                            "before_after": {label: verdict for label, _, _, _, verdict
                                             in before_after(summary, b)}}
                           for b in sizes],
               "runs": [{"variant": x["variant"], "round": x["round"], "ok": x["ok"],
                         "error": x["error"], "seconds": x["seconds"],
                         "busy_before": x.get("busy_before"),
                         "memcpy_gbps": (x["doc"] or {}).get("memcpy_gbps"),
                         "transports": (x["doc"] or {}).get("transports")} for x in records],
               "rows": [dict(row, variant=x["variant"], round=x["round"])
                        for x in records if x["doc"] for row in x["doc"].get("rows", [])]}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(f"All-reduce, float32 sum, {args.ranks} ranks on one host, {args.placement}; "
                    f"median of {rounds} runs of {args.iters} iterations after "
                    f"{args.warmup} warm-up, time = {args.stat} per iteration (max over ranks). "
                    + (f"Runs started while other processes kept over {args.max_busy:.0%} of "
                       f"the CPUs busy are left out. " if args.max_busy is not None else "")
                    + "busbw in GB/s (nccl-tests), time in µs; ratios are "
                    "time_other / time_braid (> 1: braid faster).")
            if memcpy:
                f.write(f" Single-thread memcpy on this machine: "
                        f"{statistics.median(memcpy):.2f} GB/s.")
            f.write("\n\n")
            for v in variants:
                if v in transports:
                    f.write(f"- {v}: `{'; '.join(sorted(transports[v]))}`\n")
            f.write("\n" + "\n".join(table_lines(summary, shown, sizes, markdown=True)) + "\n")
            ba = before_after_lines(summary, sizes, markdown=True)
            if ba:
                f.write(f"\nBefore/after (base {args.base or '(loaded)'}): median time of "
                        f"{rounds} runs with its spread (min-max) in µs; before/after = "
                        f"time_base / time_this (> 1: this build faster); \"slower\" or "
                        f"\"faster\" only when the two ranges do not overlap.\n\n")
                f.write("\n".join(ba) + "\n")
            if failures:
                f.write("\nFailed runs: " + "; ".join(
                    f"{x['variant']} (round {x['round'] + 1}): {x['error']}"
                    for x in failures) + "\n")

    braid_failed = any(f["variant"].startswith("braid") for f in failures)
    return 1 if braid_failed or any(wrong.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
