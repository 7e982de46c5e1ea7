"""Horovod's documented process-set examples (its docs, "Process Sets: Concurrently Running
Collective Operations": static sets, then dynamic ones), with only the import line changed,
on 4 ranks; each result is checked.

    horovod_process_sets.py static | dynamic | dynamic_env (BRAID_DYNAMIC_PROCESS_SETS=1)
"""

import sys

import torch

import braid.torch as hvd  # the only change: `import horovod.torch as hvd`
from _common import check, main


def static():
    # on all ranks
    even_set = hvd.ProcessSet([0, 2])
    odd_set = hvd.ProcessSet([1, 3])
    hvd.init(process_sets=[even_set, odd_set])
    _use(even_set, odd_set)


def dynamic():
    # on all ranks
    hvd.init(process_sets="dynamic")
    even_set = hvd.add_process_set([0, 2])
    odd_set = hvd.add_process_set([1, 3])
    _use(even_set, odd_set)
    hvd.remove_process_set(odd_set)
    check(odd_set.process_set_id is None, "a removed set is unregistered")


def dynamic_env():
    # HOROVOD_DYNAMIC_PROCESS_SETS=1 instead of the argument (BRAID_DYNAMIC_PROCESS_SETS=1)
    hvd.init()
    even_set = hvd.add_process_set([0, 2])
    odd_set = hvd.add_process_set([1, 3])
    _use(even_set, odd_set)


def _use(even_set, odd_set):
    printed = [repr(p) for p in [hvd.global_process_set, even_set, odd_set]]
    for p in printed:
        print(p)
    check(printed == ["ProcessSet(process_set_id=0, ranks=[0, 1, 2, 3])",
                      "ProcessSet(process_set_id=1, ranks=[0, 2])",
                      "ProcessSet(process_set_id=2, ranks=[1, 3])"], f"printed {printed}")
    tensor = torch.full((4,), float(hvd.rank()))
    if hvd.rank() in (0, 2):
        # on ranks 0 and 2
        result = hvd.allreduce(tensor, process_set=even_set)
        check(torch.equal(result, torch.full((4,), 1.0)), f"even set's average {result}")
    else:
        # on ranks 1 and 3
        result = hvd.allreduce(tensor, process_set=odd_set)
        check(torch.equal(result, torch.full((4,), 2.0)), f"odd set's average {result}")
    result = hvd.allreduce(tensor)  # the global set, unchanged
    check(torch.equal(result, torch.full((4,), 1.5)), f"global average {result}")


if __name__ == "__main__":
    main({"static": static, "dynamic": dynamic, "dynamic_env": dynamic_env}[sys.argv[1]])
