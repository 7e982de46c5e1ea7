"""Bad inputs from Python, each with its clear error (a braid.BraidError subclass naming the
argument), none of which crashes or poisons the job: a valid collective works after them.

Runs as a job of one rank without a launcher. First the configuration: each bad variable
(NaN, infinite, negative, tiny, non-integer, out of range, malformed address) makes
braid.init() raise InvalidArgumentError naming it. Then the NumPy and PyTorch APIs: names,
ranks, splits, ops, timeouts, compression specs, scale factors and shapes of the wrong type
or beyond their limits. Prints one line per case ("case N: ...") for the test to count.
"""

import os

import numpy as np

import braid
from _common import check, expect_raises, log, main

CASES = 0


def case(cls, fn, what, contains=()):
    global CASES
    CASES += 1
    msg = expect_raises(cls, fn, what, contains=contains)
    log(f"case {CASES}: {what} -> {cls.__name__}: {msg}")


def config_cases():
    IA = braid.InvalidArgumentError
    bad_env = [
        ("BRAID_TIMEOUT_S", "nan", "BRAID_TIMEOUT_S must be a positive number of seconds, got 'nan'"),
        ("BRAID_TIMEOUT_S", "inf", "got 'inf'"),
        ("BRAID_HEARTBEAT_TIMEOUT_S", "0.1", "BRAID_HEARTBEAT_TIMEOUT_S must be at least 400ms"),
        ("BRAID_NEGOTIATION_TIMEOUT_S", "-5", "BRAID_NEGOTIATION_TIMEOUT_S must be a positive"),
        ("BRAID_CYCLE_TIME_MS", "1.5", "BRAID_CYCLE_TIME_MS must be an integer, got '1.5'"),
        ("BRAID_FUSION_THRESHOLD", "1e9", "BRAID_FUSION_THRESHOLD must be an integer, got '1e9'"),
        ("BRAID_COORDINATOR_PORT", "70000", "BRAID_COORDINATOR_PORT must be in [1, 65535]"),
        ("BRAID_COORDINATOR", "localhost", "BRAID_COORDINATOR must be HOST:PORT"),
        ("BRAID_COORDINATOR", "[::1]:99999", "BRAID_COORDINATOR must be HOST:PORT"),
        ("BRAID_SIZE", "2.0", "BRAID_SIZE must be an integer, got '2.0'"),
        ("BRAID_LAUNCHER_PIPE", "3", "BRAID_LAUNCHER_PIPE must be FD:INODE (braidrun sets it), "
                                     "got '3'"),
    ]
    for var, value, want in bad_env:
        os.environ[var] = value
        try:
            case(IA, braid.init, f"{var}={value}", contains=want)
        finally:
            del os.environ[var]
        check(not braid.is_initialized(), f"{var}={value} left braid initialized")


def numpy_cases():
    IA = braid.InvalidArgumentError
    x = np.ones(4, np.float32)
    huge = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), shape=(1 << 24, 1 << 24),
                                           strides=(0, 0))
    case(IA, lambda: braid.allreduce(huge, name="huge"), "a zero-strided view of 2^48 elements",
         ("'huge'", "more than the limit of a tensor, 2^48 bytes"))
    case(IA, lambda: braid.allreduce(x, name=5), "an int as a name", "name must be a str, got int")
    case(IA, lambda: braid.allreduce(x, name=b"w"), "bytes as a name", "name must be a str")
    case(IA, lambda: braid.allreduce(x, name="n" * 2000), "a 2000-byte name",
         "name is 2000 bytes long, more than the limit of 1024")
    case(IA, lambda: braid.allreduce(x, name=""), "an empty name", "name is empty")
    # A str with no UTF-8 form (a lone surrogate, as os.fsdecode makes of undecodable bytes):
    # never the native module's TypeError.
    surrogate = "allreduce: name is not valid UTF-8: 'g\\udc80' holds '\\udc80' at index 1 " \
                "(surrogates not allowed)"
    case(IA, lambda: braid.allreduce(x, name="g\udc80"), "a name with a lone surrogate",
         surrogate)
    case(IA, lambda: braid.allreduce_async(x, name="g\udc80"), "async: a lone surrogate",
         surrogate)
    case(IA, lambda: braid.broadcast_object(1, name="g\udc80"), "an object's name: a surrogate",
         "broadcast_object: name is not valid UTF-8: 'g\\udc80'")
    case(IA, lambda: braid.allreduce(x, name="c", compression="fp16\udc80"),
         "a compression spec with a surrogate", "compression is not valid UTF-8")
    case(IA, lambda: braid.allreduce(x, name="op", op=1.0), "op=1.0", "unknown reduce op 1.0")
    case(IA, lambda: braid.allreduce(x, name="op", op="sum"), "op='sum'", "unknown reduce op")
    case(IA, lambda: braid.allreduce(x, name="op", op=True), "op=True", "unknown reduce op")
    case(IA, lambda: braid.broadcast(x, 0.5, name="root"), "root_rank=0.5",
         "root_rank must be an integer, got float 0.5")
    case(IA, lambda: braid.broadcast(x, "0", name="root"), "root_rank='0'",
         "root_rank must be an integer, got str")
    case(IA, lambda: braid.broadcast(x, 1 << 40, name="root"), "root_rank=2^40",
         "root_rank must be in [-2147483648, 2147483647]")
    case(IA, lambda: braid.alltoall(np.ones(2, np.float32), splits=[1.5, 0.5], name="s"),
         "splits of floats", "splits[0] must be an integer, got float 1.5")
    case(IA, lambda: braid.alltoall(np.ones(2, np.float32), splits=[1 << 62, -(1 << 62)],
                                    name="s"), "splits that overflow int64 when summed",
         "splits[0] must be in [0, 281474976710656]")
    case(IA, lambda: braid.alltoall(np.ones(2, np.float32), splits=np.array([1.0, 1.0]),
                                    name="s"), "a float array of splits",
         "splits must hold integers, got dtype float64")
    case(IA, lambda: braid.alltoall(np.ones(2, np.float32), splits=[1, 1, 0], name="s"),
         "three splits for one rank", "splits has 3 entries for 1 ranks")
    case(IA, lambda: braid.allreduce(x, name="c", compression=4), "compression=4",
         "compression must be a string")
    case(IA, lambda: braid.allreduce(x, name="c", compression="fp4:" + "x" * 1000),
         "a 1004-character compression spec", "more than the limit of 256")
    case(IA, lambda: braid.allreduce(None, name="none"), "None as a tensor", "unsupported dtype")
    h = braid.allreduce_async(x, name="t")
    case(IA, lambda: braid.synchronize(h, timeout="1"), "timeout='1'",
         "timeout must be a number of seconds or None, got str")
    case(IA, lambda: braid.synchronize(h, timeout=float("nan")), "timeout=NaN",
         "timeout must be >= 0 seconds, got nan")
    check(np.array_equal(braid.synchronize(h), x), "the collective the bad timeouts were "
          "given for still completes")
    case(IA, lambda: braid.load_compression_state("state"), "a str as compression state",
         "state must be bytes")


def torch_cases():
    import torch
    import braid.torch as hvd
    IA = braid.InvalidArgumentError
    t = torch.ones(4)
    huge = torch.ones(1, 1).expand(1 << 24, 1 << 24)
    case(IA, lambda: hvd.allreduce(huge, name="huge"), "torch: an expanded view of 2^48 elements",
         "more than the limit of a tensor, 2^48 bytes")
    case(IA, lambda: hvd.allreduce(t, name=3.5), "torch: a float as a name",
         "name must be a str, got float")
    case(IA, lambda: hvd.alltoall(t, name="g\udc80"), "torch: a name with a lone surrogate",
         "alltoall: name is not valid UTF-8: 'g\\udc80' holds '\\udc80' at index 1")
    case(IA, lambda: hvd.broadcast_parameters({"w\udc80": torch.ones(2)}, 0),
         "torch: a parameter name with a lone surrogate", "name is not valid UTF-8")
    case(IA, lambda: hvd.allreduce(t, name="c", compression="fp16\udc80"),
         "torch: a compression spec with a surrogate", "compression is not valid UTF-8")
    case(IA, lambda: hvd.allreduce(t, name="p", prescale_factor=float("nan")),
         "torch: prescale_factor=NaN", "prescale_factor must be a finite number")
    case(IA, lambda: hvd.allreduce(t, name="p", postscale_factor="2"),
         "torch: postscale_factor='2'", "postscale_factor must be a finite number")
    case(IA, lambda: hvd.broadcast(t, root_rank=0.0, name="r"), "torch: root_rank=0.0",
         "root_rank must be an integer, got float 0.0")
    case(IA, lambda: hvd.alltoall(torch.ones(2), splits=torch.tensor([1.0, 1.0]), name="s"),
         "torch: float splits", "splits must be a 1-D integer tensor")
    case(IA, lambda: hvd.allreduce(t, name="o", op=2.0), "torch: op=2.0", "unknown reduce op")
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    case(IA, lambda: hvd.DistributedOptimizer(opt, backward_passes_per_step=1.5),
         "torch: backward_passes_per_step=1.5",
         "backward_passes_per_step must be an integer, got float 1.5")
    case(IA, lambda: hvd.DistributedOptimizer(opt, gradient_predivide_factor=float("inf")),
         "torch: gradient_predivide_factor=inf", "gradient_predivide_factor must be a finite")
    check(torch.equal(hvd.allreduce(t, name="fine"), t), "torch: a valid all-reduce after them")


def body():
    config_cases()
    braid.init()
    numpy_cases()
    torch_cases()
    check(np.array_equal(braid.allreduce(np.arange(3.0), name="after"), np.arange(3.0)),
          "a valid all-reduce after every bad input")
    log(f"bad inputs: {CASES} cases")
    braid.shutdown()


main(body)
