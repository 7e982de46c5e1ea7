"""An elastic job with a dynamic process set (test_elastic_long.py): the set is re-added by a
reset callback after each membership change, as docs/elastic.md says, and its all-reduces
keep giving the right sums. Arguments: --report DIR (the events, as
examples/elastic_fashion_mnist.py writes them, and `ready` before training starts), --steps
N, and --slow-start-worker W: that worker sleeps 3 s before training, so the others wait for
it in the first sync."""
import argparse
import json
import os
import time

import torch

import braid.torch as hvd

p = argparse.ArgumentParser()
p.add_argument("--report", required=True)
p.add_argument("--steps", type=int, default=80)
p.add_argument("--slow-start-worker", type=int, default=-1)
args = p.parse_args()
report_file = open(os.path.join(args.report, f"worker{os.environ['BRAID_WORKER']}.jsonl"), "a",
                   buffering=1)


def report(event, **fields):
    fields.update(event=event, pid=os.getpid(), time=time.time())
    report_file.write(json.dumps(fields) + "\n")


hvd.init(process_sets="dynamic")
sets = {}


def add_sets():
    # In a world of two, [0, 1] is the whole world: global_process_set.
    sets["pair"] = hvd.add_process_set([0, 1]) if hvd.size() > 2 else hvd.global_process_set


add_sets()
state = hvd.elastic.ObjectState(step=0, total=0.0)
state.register_reset_callbacks([add_sets])


@hvd.elastic.run
def train(state):
    report("start", size=hvd.size(), rank=hvd.rank(), epoch=0, batch=state.step,
           checksum=state.total)
    while state.step < args.steps:
        world = hvd.allreduce(torch.ones(4), name="world", op=hvd.Sum)
        assert int(world[0]) == hvd.size(), (world, hvd.size())
        if hvd.rank() in (0, 1):
            pair = hvd.allreduce(torch.ones(4), name="pair", op=hvd.Sum,
                                 process_set=sets["pair"])
            assert int(pair[0]) == 2, pair
        state.total += float(world[0])
        state.step += 1
        time.sleep(0.05)
        if state.step % 5 == 0:
            state.commit()
            report("commit", epoch=0, batch=state.step)


report("ready")
if int(os.environ["BRAID_WORKER"]) == args.slow_start_worker:
    time.sleep(3)
train(state)
report("end", size=hvd.size(), rank=hvd.rank(), checksum=state.total, accuracy=1.0)
hvd.shutdown()
