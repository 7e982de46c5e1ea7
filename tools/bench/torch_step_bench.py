#!/usr/bin/python3
"""torch_step_bench.py: one training step of the Fashion-MNIST CNN, braid vs PyTorch DDP.

    /usr/bin/python3 tools/bench/torch_step_bench.py --ranks 2 --steps 60 --warmup 10 \\
        --runs 3 [--compression none] [--ddp-hook auto] [--json step.json]

Trains examples/train_fashion_mnist.py's CNN (215k float32 parameters: 861 KB of gradients
per step) on real Fashion-MNIST batches (--batch-size per rank), with braid.torch's
DistributedOptimizer (under braidrun, UCX shared memory) and with DistributedDataParallel
over gloo (TCP on lo), --runs times each, interleaved (braid, DDP, braid, DDP, ...), so both
see the same machine. Each rank times every step (zero_grad + forward, backward, waiting for
the gradients' all-reduces, the optimizer's update); a step's time is the slowest rank's; a
run's figure is the median over its --steps timed steps; the table shows the median over runs
and the ratio braid / DDP (< 1: braid faster).

Compression: braid runs --compression (a spec; default none). DDP runs the communication
hook --ddp-hook names: `none` (plain all-reduce), `fp16` (fp16_compress_hook) or
`powersgd` (powerSGD_hook with the rank, min_compression_rate, error feedback, warm start
and orthogonalization epsilon of braid's powersgd spec, or rank 1 and the hook's defaults
otherwise); `auto` (default) picks the hook matching --compression (powersgd -> powersgd,
fp16 -> fp16, anything else -> none). The hook's start_powerSGD_iter is 2, the least DDP
allows with error feedback or warm start (its first two steps are plain all-reduces), so
--warmup must be at least 2 and every timed step compresses on both sides. The table adds
each side's payload ratio over the whole run (braid: its byte counters; DDP: the hook's
own element counts, from its first compressed step).

Breakdown: "backward" is loss.backward(); for braid it only queues the all-reduces (the hooks),
which then run on braid's background thread, and "comm wait" is what optimizer.synchronize()
still waits for after backward. DDP waits for its all-reduces at the end of backward, so its
"backward" includes its communication wait. braid's timeline (BRAID_TIMELINE) adds, per step:
the gradients' communication from the first negotiation to the last completion, how much of
it overlapped backward, the negotiation (first request to last agreement) and the time in
all-reduce proper.

The machine's load matters (2 cores, 2 ranks): the share of CPU other processes used just
before each run is printed, with a warning above 15%.
"""
import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PYTHON = "/usr/bin/python3"
sys.path.insert(0, HERE)
from compare import BUSY_WARN, background_busy  # noqa: E402

PHASES = ("forward", "backward", "comm_wait", "optimizer", "step")


# --- one rank ---------------------------------------------------------------------------------

def worker(args):
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, os.path.join(REPO, "examples"))
    import fashion_mnist_data as fmnist
    from train_fashion_mnist import Net

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Net()
    hook_state = None
    if args.worker == "braid":
        import braid.torch as hvd
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                       compression=args.compression)
        net = model
    else:
        import torch.distributed as dist
        dist.init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()
        net = torch.nn.parallel.DistributedDataParallel(model)
        hook_state = register_ddp_hook(net, args)
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    total = args.warmup + args.steps
    images, labels = fmnist.load("train")
    n = total * args.batch_size
    first = rank * n  # each rank its own images, normalised before timing
    x = fmnist.normalize(images[first:first + n]).split(args.batch_size)
    y = labels[first:first + n].split(args.batch_size)
    clock = None
    if args.worker == "braid":  # a marker whose NEGOTIATE begin aligns the timeline's clock
        clock = time.time()
        hvd.allreduce(torch.zeros(1), name="bench.clock", compression="none")
    else:
        dist.barrier()
    copies = hvd.staging_copies() if args.worker == "braid" else 0
    steps = []
    for i in range(total):
        t0 = time.time()
        opt.zero_grad()
        loss = F.cross_entropy(net(x[i]), y[i])
        t1 = time.time()
        loss.backward()
        t2 = time.time()
        if args.worker == "braid":
            opt.synchronize()
            t3 = time.time()
            with opt.skip_synchronize():
                opt.step()
        else:
            t3 = t2
            opt.step()
        t4 = time.time()
        steps.append([t0, t1, t2, t3, t4])
    if args.worker == "braid":
        grads = [t for n, t in hvd.compression_stats()["tensors"].items()
                 if n.startswith("grad.")]
        payload = sum(t["payload_bytes"] for t in grads)
        ratio = sum(t["uncompressed_bytes"] for t in grads) / payload if payload else 0.0
    elif hook_state is not None:
        ratio = hook_state.compression_stats()[0]
    else:
        ratio = 2.0 if args.ddp_hook == "fp16" else 1.0
    with open(f"{args.out}.rank{rank}.json", "w") as f:
        if args.worker == "braid":  # gradients are contiguous: none may be staged
            copies = hvd.staging_copies() - copies
        json.dump({"rank": rank, "size": size, "clock": clock, "warmup": args.warmup,
                   "staging_copies": copies, "payload_ratio": ratio,
                   "steps": steps, "parameters": sum(p.numel() for p in model.parameters())},
                  f)
    sys.stdout.flush()
    if args.worker == "braid":
        hvd.shutdown()
        return 0
    # Debian's torch 1.13 gloo backend sometimes aborts or hangs at interpreter exit.
    os._exit(0)


def powersgd_options(spec):
    """braid's powersgd spec as powerSGD_hook's arguments (the hook's defaults otherwise)."""
    opts = {"rank": "1", "min_compression_rate": "2", "ef": "1", "warm_start": "1",
            "orthogonalization_epsilon": "0"}
    method, _, rest = (spec or "").partition(":")
    if method.strip() == "powersgd" and rest:
        for item in rest.split(","):
            k, _, v = item.partition("=")
            opts[k.strip()] = v.strip()
    return {"matrix_approximation_rank": int(opts["rank"]),
            "min_compression_rate": float(opts["min_compression_rate"]),
            "use_error_feedback": opts["ef"] in ("1", "true"),
            "warm_start": opts["warm_start"] in ("1", "true"),
            "orthogonalization_epsilon": float(opts["orthogonalization_epsilon"])}


def resolve_ddp_hook(hook, compression):
    if hook != "auto":
        return hook
    method = (compression or "none").partition(":")[0].strip()
    return method if method in ("powersgd", "fp16") else "none"


def register_ddp_hook(net, args):
    """Registers --ddp-hook on the DDP model; returns powerSGD_hook's state (else None)."""
    if args.ddp_hook == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        net.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif args.ddp_hook == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
        state = psgd.PowerSGDState(process_group=None, start_powerSGD_iter=2, random_seed=0,
                                   **powersgd_options(args.compression))
        net.register_comm_hook(state, psgd.powerSGD_hook)
        return state
    return None


# --- the timeline ---------------------------------------------------------------------------

def timeline_steps(path, clock):
    """Per training step, from braid's Chrome-trace timeline of one rank: the gradients'
    communication (first NEGOTIATE begin, last event end), the end of the last negotiation,
    and the union of their ALLREDUCE spans, in seconds of the Python clock."""
    with open(path) as f:
        events = json.load(f)
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M"}
    per_tensor = {}
    for e in events:
        if e.get("ph") in ("B", "E"):
            per_tensor.setdefault(names.get(e["tid"], "?"), []).append(e)
    marks = [e for e in per_tensor.get("bench.clock", [])
             if e["name"] == "NEGOTIATE" and e["ph"] == "B"]
    if not marks:
        raise RuntimeError(f"{path}: no bench.clock marker")
    offset = clock - marks[0]["ts"] / 1e6
    steps = {}
    for name, evs in per_tensor.items():
        if not name.startswith("grad."):
            continue
        k = -1
        for e in evs:  # the k-th NEGOTIATE begin of a gradient opens step k
            if e["name"] == "NEGOTIATE" and e["ph"] == "B":
                k += 1
            s = steps.setdefault(k, {"start": [], "end": [], "negotiated": [], "allreduce": []})
            t = offset + e["ts"] / 1e6
            if e["name"] == "NEGOTIATE":
                (s["start"] if e["ph"] == "B" else s["negotiated"]).append(t)
            if e["ph"] == "E":
                s["end"].append(t)
            if e["name"] == "ALLREDUCE":
                s["allreduce"].append((e["ph"], t))
    out = []
    for k in sorted(steps):
        s = steps[k]
        spans = sorted(s["allreduce"], key=lambda x: x[1])
        busy, open_at, depth = 0.0, None, 0  # union of the (fused, overlapping) spans
        for ph, t in spans:
            if ph == "B":
                if depth == 0:
                    open_at = t
                depth += 1
            else:
                depth -= 1
                if depth == 0:
                    busy += t - open_at
        out.append({"start": min(s["start"]), "end": max(s["end"]),
                    "negotiated": max(s["negotiated"]), "allreduce": busy})
    return out


# --- the driver -------------------------------------------------------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_all(procs, timeout):
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    os.killpg(q.pid, signal.SIGKILL)
            raise
    return [p.returncode for p in procs]


def launch(framework, args, workdir, run):
    out = os.path.join(workdir, f"{framework}{run}")
    cmd = [PYTHON, os.path.abspath(__file__), "--worker", framework, "--out", out,
           "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--batch-size", str(args.batch_size)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", UCX_TLS="sm",
               UCX_NET_DEVICES="lo", GLOO_SOCKET_IFNAME="lo")
    # The model comes from the example, which imports braid.torch (DDP's ranks too).
    py = os.path.join(args.build_dir, "python")
    env["PYTHONPATH"] = py + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    log = open(os.path.join(workdir, f"{framework}{run}.log"), "w")
    if args.compression:
        cmd += ["--compression", args.compression]
    if framework == "ddp":
        cmd += ["--ddp-hook", args.ddp_hook]
    if framework == "braid":
        env["BRAID_TIMELINE"] = out + ".timeline.json"
        braidrun = os.path.join(args.build_dir, "tools", "braidrun", "braidrun")
        procs = [subprocess.Popen([braidrun, "-np", str(args.ranks)] + cmd, env=env, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)]
    else:
        port = _free_port()
        procs = []
        for r in range(args.ranks):
            e = dict(env, RANK=str(r), WORLD_SIZE=str(args.ranks), LOCAL_RANK=str(r),
                     LOCAL_WORLD_SIZE=str(args.ranks), MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(port))
            procs.append(subprocess.Popen(cmd, env=e, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
    codes = _wait_all(procs, args.timeout)
    log.close()
    if any(codes):
        sys.exit(f"{framework} run {run} failed ({codes}); log: {log.name}")
    ranks = []
    for r in range(args.ranks):
        with open(f"{out}.rank{r}.json") as f:
            ranks.append(json.load(f))
    return out, ranks


def summarize(ranks, timeline=None):
    """Medians over the timed steps; a step's phases are the slowest rank's step and the
    mean over ranks of each phase."""
    warm = ranks[0]["warmup"]
    rows = []
    for i in range(warm, len(ranks[0]["steps"])):
        ph = {k: [] for k in PHASES}
        for rk in ranks:
            t0, t1, t2, t3, t4 = rk["steps"][i]
            for k, v in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0)):
                ph[k].append(v)
        row = {k: statistics.mean(v) for k, v in ph.items()}
        row["step"] = max(ph["step"])
        if timeline is not None:
            tl = timeline[i]
            b0, b1 = ranks[0]["steps"][i][1], ranks[0]["steps"][i][2]  # rank 0's backward
            row["comm"] = tl["end"] - tl["start"]
            row["overlap"] = max(0.0, min(tl["end"], b1) - max(tl["start"], b0))
            row["negotiation"] = tl["negotiated"] - tl["start"]
            row["allreduce"] = tl["allreduce"]
        rows.append(row)
    out = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    out["payload_ratio"] = ranks[0]["payload_ratio"]
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=60, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    p.add_argument("--runs", type=int, default=3, help="runs per framework, interleaved")
    p.add_argument("--batch-size", type=int, default=32, help="images per rank per step")
    p.add_argument("--compression", default=None, help="braid's gradient compression spec")
    p.add_argument("--ddp-hook", choices=("auto", "none", "fp16", "powersgd"), default="auto",
                   help="DDP's communication hook (auto: the one matching --compression)")
    p.add_argument("--build-dir", default=os.environ.get("BRAID_BUILD_DIR",
                                                         os.path.join(REPO, "build")))
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--json", default=None)
    p.add_argument("--worker", choices=("braid", "ddp"), help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    args.ddp_hook = resolve_ddp_hook(args.ddp_hook, args.compression)
    if args.ddp_hook == "powersgd" and args.warmup < 2:
        p.error("--ddp-hook powersgd needs --warmup >= 2 (DDP's first two steps are not "
                "compressed)")

    results = {"braid": [], "ddp": []}
    busy = []
    with tempfile.TemporaryDirectory(prefix="braid-step-bench-") as workdir:
        for run in range(args.runs):
            for fw in ("braid", "ddp"):
                b = background_busy(0.5)
                busy.append(b)
                out, ranks = launch(fw, args, workdir, run)
                tl = timeline_steps(out + ".timeline.json", ranks[0]["clock"]) \
                    if fw == "braid" else None
                s = summarize(ranks, tl)
                s["busy_before"] = b
                s["staging_copies"] = sum(r["staging_copies"] for r in ranks)
                results[fw].append(s)
                print(f"# run {run} {fw:5s}: step {1e3 * s['step']:.2f} ms  payload ratio "
                      f"{s['payload_ratio']:.2f}x  (CPUs "
                      f"{0 if b is None else b:.0%} busy before)", flush=True)
    params = ranks[0]["parameters"]
    med = {fw: {k: statistics.median(r[k] for r in rs) for k in rs[0]
                if k not in ("busy_before", "staging_copies")}
           for fw, rs in results.items()}
    label = f"braid-{args.compression or 'none'}"
    ddp_label = "ddp-gloo" + ("" if args.ddp_hook == "none" else f"+{args.ddp_hook}_hook")
    if args.ddp_hook == "powersgd":
        ddp_label += f"(rank={powersgd_options(args.compression)['matrix_approximation_rank']})"
    print(f"# one training step of the Fashion-MNIST CNN ({params} float32 parameters, "
          f"{4 * params / 1e3:.0f} KB of gradients), {args.batch_size} images per rank, "
          f"{args.ranks} ranks; median over {args.runs} interleaved runs of the median over "
          f"{args.steps} steps (after {args.warmup}); times in ms")
    w = max(12, len(label), len(ddp_label))
    print(f"# {'framework':{w}s} {'step':>8s} {'fwd':>8s} {'backward':>9s} {'comm wait':>10s} "
          f"{'optimizer':>10s} {'vs ddp':>8s} {'payload ratio':>14s}")
    for fw, name in (("braid", label), ("ddp", ddp_label)):
        m = med[fw]
        print(f"  {name:{w}s} {1e3 * m['step']:8.2f} {1e3 * m['forward']:8.2f} "
              f"{1e3 * m['backward']:9.2f} {1e3 * m['comm_wait']:10.2f} "
              f"{1e3 * m['optimizer']:10.2f} {m['step'] / med['ddp']['step']:7.2f}x "
              f"{m['payload_ratio']:13.2f}x")
    m = med["braid"]
    print(f"# braid timeline, per step (rank 0): gradients' communication {1e3 * m['comm']:.2f} "
          f"ms from the first negotiation to the last completion, {1e3 * m['overlap']:.2f} ms "
          f"of it during backward; negotiation {1e3 * m['negotiation']:.2f} ms; all-reduce "
          f"{1e3 * m['allreduce']:.2f} ms")
    print("# ddp's backward includes waiting for its all-reduces (comm wait 0 by construction)")
    print(f"# braid staging copies during training (all runs, all ranks): "
          f"{sum(r['staging_copies'] for r in results['braid'])} (gradients reach the runtime "
          "by address)")
    b = [x for x in busy if x is not None]
    if b and max(b) > BUSY_WARN:
        print(f"# WARNING: other processes kept the CPUs up to {max(b):.0%} busy before runs "
              f"(median {statistics.median(b):.0%}); timings on this machine are unreliable, "
              "rerun when it is idle")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ranks": args.ranks, "batch_size": args.batch_size,
                       "parameters": params, "steps": args.steps, "runs": args.runs,
                       "compression": args.compression or "none", "ddp_hook": args.ddp_hook,
                       "median": med,
                       "runs_detail": results, "busy_before": busy}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
