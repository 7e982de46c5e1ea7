#!/usr/bin/python3
"""elastic_bench.py: elastic training's goals (docs/elastic.md), measured on this host.

    tools/bench/elastic_bench.py [--build-dir build] [--repeats 3] [--epochs 2]
                                 [--train-subset 60000] [--timings-only] [--json PATH]

Every job runs examples/elastic_fashion_mnist.py under braidrun --min-np 2 with a host
discovery script (re-run every second unless said otherwise), 3 ranks on this host, through
the test harness (tests/python/elastic_jobs.py). Per round, side by side:

  accuracy  the full run (--epochs over --train-subset images) without a failure, and the
            same run in which worker 2 is killed (kill -9) after 10 commits and, 10 commits
            of worker 0 later, a host (127.0.0.1) is added: the test accuracies and their
            difference (goal: within 1 point);
  loss      a short run killed the same way: from the kill to the survivors' next
            completed step (goal: 5 s plus the state broadcast);
  heartbeat the same with SIGSTOP, found lost by the heartbeat alone (BRAID_HEARTBEAT_
            TIMEOUT_S, default 10 s; goal: the timeout + 5 s);
  join      a short run whose discovery output gains a host (interval 5 s, braidrun's
            default): from the change to the new rank's first completed step (goal: the
            interval + 10 s);
  drain     a run of 750 steps whose discovery output loses a host (127.0.0.1, worker 2's;
            interval 5 s): from the change to the survivors' first completed step without
            worker 2 (no goal: two outputs in a row, a heartbeat, the next commit).

--timings-only leaves out the accuracy pair (the long part).

Prints one line per job and the medians over rounds; --json writes them.
"""
import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "python"))
import elastic_jobs  # noqa: E402

SHORT = ("--epochs", "2", "--train-subset", "3000", "--step-delay", "0.05")


def first_step_after(job, workers, t0):
    """The first 'step' event of any of `workers` after time t0 (None if none)."""
    times = [e["time"] for w in workers for e in job.events.get(w, [])
             if e["event"] == "step" and e["time"] > t0]
    return min(times) if times else None


def run(name, tmp, np=3, **kw):
    d = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=tmp))
    job = elastic_jobs.run(d, np=np, min_np=2, timeout=1800, **kw)
    if job.returncode != 0:
        sys.exit(f"{name}: braidrun exited {job.returncode}:\n{job.output[-4000:]}")
    return job


def accuracy_pair(tmp, args):
    full = ("--epochs", str(args.epochs), "--train-subset", str(args.train_subset))
    base = run("base", tmp, hosts="localhost:3\n", args=full)
    hit = run("disturbed", tmp, hosts="localhost:3\n", args=full,
              disturb=[(2, 10, signal.SIGKILL), (0, 20, "localhost:3\n127.0.0.1:1\n")])
    a, b = base.end(0)["accuracy"], hit.end(0)["accuracy"]
    assert hit.end(3) is not None, "the added host's rank did not finish"
    return {"accuracy_base": a, "accuracy_disturbed": b, "points_lost": 100 * (a - b)}


def timings(tmp):
    out = {}
    job = run("loss", tmp, hosts="localhost:3\n", args=SHORT,
              disturb=[(2, 4, signal.SIGKILL)])
    out["loss_to_step_s"] = first_step_after(job, (0, 1), job.disturbed_at[0]) - \
        job.disturbed_at[0]
    job = run("heartbeat", tmp, hosts="localhost:3\n", args=SHORT,
              disturb=[(2, 4, signal.SIGSTOP)])
    out["heartbeat_loss_to_step_s"] = first_step_after(job, (0, 1), job.disturbed_at[0]) - \
        job.disturbed_at[0]
    job = run("join", tmp, hosts="localhost:2\n", args=SHORT,
              discovery_interval=5, np=2,
              disturb=[(0, 3, "localhost:2\n127.0.0.1:1\n")])
    out["join_to_step_s"] = first_step_after(job, (2,), job.disturbed_at[0]) - \
        job.disturbed_at[0]
    # Longer than SHORT: two runs of the script 5 s apart must come before training ends.
    job = run("drain", tmp, hosts="localhost:2\n127.0.0.1:1\n",
              args=("--epochs", "3", "--train-subset", "8000", "--step-delay", "0.05"),
              discovery_interval=5, disturb=[(0, 3, "localhost:2\n")])
    assert job.end(2) is None and job.end(0)["size"] == 2, "worker 2 was not drained"
    out["drain_to_step_s"] = first_step_after(job, (0, 1), job.disturbed_at[0]) - \
        job.disturbed_at[0]
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build-dir", default=str(REPO / "build"))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--train-subset", type=int, default=60000)
    p.add_argument("--timings-only", action="store_true")
    p.add_argument("--json", default="")
    args = p.parse_args()
    os.environ["BRAID_BUILD_DIR"] = str(Path(args.build_dir).resolve())
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            row = timings(tmp)
            if not args.timings_only:
                row.update(accuracy_pair(tmp, args))
            print(f"round {r}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()),
                  flush=True)
            rounds.append(row)
    medians = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    print("medians: " + ", ".join(f"{k} {v:.3f}" for k, v in medians.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rounds, "medians": medians}, indent=1))


if __name__ == "__main__":
    main()
