#!/usr/bin/python3
"""gloo_bench.py: torch.distributed (backend gloo) all_reduce, float32 sum, timed like
braid-bench (the nccl-tests method), so tools/bench/compare.py can put gloo next to braid.

    /usr/bin/python3 tools/bench/gloo_bench.py -b 4 -e 64M -f 4 -n 20 -w 5 --ranks 2 --json g.json

N ranks are forked on this host and rendezvous on 127.0.0.1 at a free port; gloo's pairs use
the loopback interface (GLOO_SOCKET_IFNAME=lo), i.e. TCP, as gloo has no shared-memory
transport. torch's all_reduce works in place, so every row is in place (inplace: true).

Method: one buffer of the largest size, allocated and touched once; for each size a view of
it: `warmup` untimed calls, a barrier, `iters` timed calls. A rank's time is its mean per call
(median kept too); the reported time is the max over ranks. algbw = bytes / time (GB/s,
1e9), busbw = algbw * 2(n-1)/n. With -c 1 the inputs hold small integers (the sum pattern of
tools/bench/bench_check.h), so the expected sum is exact; one more call is checked.
"""
import argparse
import datetime
import json
import multiprocessing
import multiprocessing.connection
import os
import re
import socket
import statistics
import sys
import time
import traceback

_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text):
    """'4', '1K', '64M', '1G' (powers of 1024, optional 'B'/'iB') -> bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(I?B)?\s*", text.upper())
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (want e.g. 8, 1K, 64M)")
    return int(m.group(1)) * _SUFFIX[m.group(2)]


def size_list(min_bytes, max_bytes, factor):
    """MIN, MIN*FACTOR, ... <= MAX (nccl-tests -b/-e/-f)."""
    if min_bytes <= 0 or max_bytes < min_bytes:
        raise ValueError(f"bad size range {min_bytes}..{max_bytes}")
    if min_bytes == max_bytes:
        return [min_bytes]
    if factor < 2:
        raise ValueError(f"step factor {factor} must be >= 2")
    sizes, s = [], min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s *= factor
    return sizes


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pattern(torch, rank, count):
    idx = torch.arange(count, dtype=torch.int64)
    return ((idx * 7 + rank * 13 + 3) % 17 - 8).to(torch.float32)


def _rank_main(rank, args, port, sizes):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.ranks,
        timeout=datetime.timedelta(seconds=args.timeout))
    n = args.ranks
    max_count = max(1, max(sizes) // 4)
    buf = torch.empty(max_count, dtype=torch.float32)
    buf.fill_(0)  # touch every page before any timing
    rows = []
    if rank == 0:
        print(f"# gloo_bench allreduce: {n} ranks, float32 sum, {args.iters} iterations after "
              f"{args.warmup} warm-up, check {args.check}, torch {torch.__version__}")
        print(f"# transports: gloo tcp (GLOO_SOCKET_IFNAME={os.environ.get('GLOO_SOCKET_IFNAME')})")
        print("#")
        print(f"# {'':>10}  {'':>11}  {'':>8}  {'':>7}  {'in-place':>38}")
        print(f"# {'size':>10}  {'count':>11}  {'type':>8}  {'redop':>7}  {'time':>10}  "
              f"{'algbw':>7}  {'busbw':>7}  {'#wrong':>6}")
        print(f"# {'(B)':>10}  {'(elements)':>11}  {'':>8}  {'':>7}  {'(us)':>10}  "
              f"{'(GB/s)':>7}  {'(GB/s)':>7}  {'':>6}", flush=True)
    for size in sizes:
        count = max(1, size // 4)
        t = buf[:count]
        if args.check:
            t.copy_(_pattern(torch, rank, count))
        for _ in range(args.warmup):
            dist.all_reduce(t)
        dist.barrier()
        iter_us = []
        start = prev = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(t)
            now = time.perf_counter()
            iter_us.append((now - prev) * 1e6)
            prev = now
        mean_us = (prev - start) * 1e6 / args.iters
        wrong = 0.0
        if args.check:
            t.copy_(_pattern(torch, rank, count))
            dist.all_reduce(t)
            want = sum(_pattern(torch, r, count) for r in range(n))
            wrong = float((t != want).sum().item())
        agree = torch.tensor([mean_us, statistics.median(iter_us), max(iter_us)],
                             dtype=torch.float64)
        dist.all_reduce(agree, op=dist.ReduceOp.MAX)
        total_wrong = torch.tensor([wrong], dtype=torch.float64)
        dist.all_reduce(total_wrong)
        time_us, median_us, max_us = agree.tolist()
        nbytes = count * 4
        algbw = nbytes / (time_us * 1e-6) / 1e9 if time_us > 0 else 0.0
        busbw = algbw * 2 * (n - 1) / n if n > 1 else 0.0
        row = {"impl": "gloo", "collective": "allreduce", "ranks": n, "bytes": nbytes,
               "count": count, "dtype": "float32", "op": "sum", "inplace": True,
               "time_us": time_us, "time_us_median": median_us, "time_us_max": max_us,
               "algbw_gbps": algbw,
               "busbw_gbps": busbw,
               "wrong": int(total_wrong.item()) if args.check else None}
        rows.append(row)
        if rank == 0:
            w = f"{row['wrong']:>6}" if args.check else f"{'N/A':>6}"
            print(f"  {nbytes:>10}  {count:>11}  {'float32':>8}  {'sum':>7}  {time_us:>10.2f}  "
                  f"{algbw:>7.3f}  {busbw:>7.3f}  {w}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    total = sum(r["wrong"] or 0 for r in rows)
    if rank == 0:
        if args.check:
            print(f"# Out of bounds values : {total} {'OK' if total == 0 else 'FAILED'}")
        avg = sum(r["busbw_gbps"] for r in rows) / len(rows) if rows else 0.0
        print(f"# Avg bus bandwidth    : {avg:.4f}\n#", flush=True)
        if args.json:
            doc = {"impl": "gloo", "collective": "allreduce", "ranks": n, "iters": args.iters,
                   "warmup": args.warmup, "torch": torch.__version__,
                   "transports": "gloo tcp ifname="
                                 + os.environ.get("GLOO_SOCKET_IFNAME", ""),
                   "ok": True, "rows": rows}
            tmp = args.json + ".tmp"
            with open(tmp, "w") as f:
                json.dump(doc, f, indent=1)
            os.replace(tmp, args.json)
    sys.exit(1 if total else 0)


def _rank_entry(rank, args, port, sizes):
    """Exit codes: 0 fine, 1 wrong elements, 2 error (an exception, e.g. a gloo timeout)."""
    try:
        _rank_main(rank, args, port, sizes)
    except SystemExit:
        raise
    except BaseException:  # noqa: B902 - report anything, then fail the rank
        print(f"gloo_bench: rank {rank}:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        os._exit(2)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("4"))
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("64M"))
    p.add_argument("-f", "--stepfactor", type=parse_size, default=4)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup_iters", dest="warmup", type=int, default=5)
    p.add_argument("-c", "--check", type=int, default=1)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--json", help="write the rows as JSON here")
    p.add_argument("--timeout", type=float, default=float(os.environ.get("BRAID_TIMEOUT_S", 60)),
                   help="gloo's collective timeout in seconds")
    p.add_argument("--deadline", type=float, default=600, help="seconds for the whole run")
    p.add_argument("--ifname", default="lo", help="GLOO_SOCKET_IFNAME")
    args = p.parse_args(argv)
    if args.iters < 1 or args.warmup < 0 or args.ranks < 1:
        p.error("need -n >= 1, -w >= 0, --ranks >= 1")
    try:
        sizes = size_list(args.minbytes, args.maxbytes, args.stepfactor)
    except ValueError as e:
        p.error(str(e))
    os.environ["GLOO_SOCKET_IFNAME"] = args.ifname
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch  # noqa: F401  (imported once here so the forked ranks start fast)

    port = free_port()
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_rank_entry, args=(r, args, port, sizes), name=f"rank{r}")
             for r in range(args.ranks)]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + args.deadline
    kill_at = None
    while True:
        # Process.exitcode reaps, so take one snapshot per pass: waiting on the sentinels of
        # ranks reaped since the loop test would sleep through the whole timeout.
        alive = [proc for proc in procs if proc.exitcode is None]
        if not alive:
            break
        now = time.monotonic()
        if kill_at is None and any(proc.exitcode not in (None, 0, 1) for proc in procs):
            kill_at = now + 5  # grace for the others to fail on their own
        if now >= deadline or (kill_at is not None and now >= kill_at):
            if now >= deadline:
                print(f"gloo_bench: deadline of {args.deadline}s passed; killing the ranks left",
                      file=sys.stderr)
            for proc in alive:
                proc.kill()
            for proc in alive:
                proc.join()
            break
        multiprocessing.connection.wait([proc.sentinel for proc in alive],
                                        timeout=min(deadline, kill_at or deadline) - now)
    rc = 0
    for r, proc in enumerate(procs):
        if proc.exitcode != 0:
            print(f"gloo_bench: rank {r} failed: exit code {proc.exitcode}", file=sys.stderr)
            rc = max(rc, 1 if proc.exitcode == 1 else 2)
    return rc


if __name__ == "__main__":
    sys.exit(main())
