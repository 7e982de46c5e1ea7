"""braid.torch end to end: real multi-process runs (2 and 3 ranks) of the rank programs in
workers/, which check every result against a reference they compute themselves, and a
comparison with PyTorch's DistributedDataParallel (gloo) trained the same way.
"""

import subprocess

import pytest

import braid_launch

torch = pytest.importorskip("torch")


def run(worker, np_, args=(), timeout=240):
    res = braid_launch.run_worker(worker, np_, args=args, timeout=timeout)
    assert res.returncode == 0, (
        f"{worker} on {np_} ranks ({res.launcher}) exited with {res.returncode}:\n{res.output}")
    for r in range(np_):
        assert f"rank {r}: all checks passed" in res.output, (
            f"{worker}: rank {r} did not report success:\n{res.output}")
    return res


@pytest.mark.parametrize("np_", [2, 4])
def test_sync_batch_norm(np_):
    """SyncBatchNorm equals one process's BatchNorm over the concatenated batch (outputs,
    input/weight/bias gradients, running statistics; training and eval; uneven and empty
    batches); a Horovod-style script with it; is_homogeneous and the MPI/Gloo answers."""
    run("torch_sync_batch_norm.py", np_)


@pytest.mark.parametrize("np_", [2, 3])
def test_collectives(np_):
    """Every collective/dtype/op vs torch references; in place vs out of place; transposed
    views; zero-copy hand-off; bool and bfloat16; autograd; objects; optimizer state; errors."""
    run("torch_collectives.py", np_)


@pytest.mark.parametrize("default", ["fp4", '{"weight": "fp4", "*": "fp16"}'])
def test_job_default_compression_applies_to_the_optimizer_only(default):
    """BRAID_COMPRESSION=fp4 (or a plan, matched against parameter names) for the job: a
    metric all-reduced directly stays exact, the DistributedOptimizer's gradients travel in 4
    bits (with every other collective check)."""
    res = braid_launch.run_worker("torch_collectives.py", 2, timeout=240,
                                  env={"BRAID_COMPRESSION": default})
    assert res.returncode == 0, res.output
    for r in range(2):
        assert f"rank {r}: all checks passed" in res.output, res.output


@pytest.mark.parametrize("np_", [2, 3])
def test_distributed_optimizer(np_):
    """Same parameters as one process on the union of the batches (backward_passes_per_step
    1 and 2, SGD and Adam); compression; unused layers; sparse gradients; misuse errors;
    p.grad replaced before step(); two optimizers with the same parameter names under
    scalecomp; add_param_group(); the first bucket all-reduced while backward runs."""
    run("torch_optimizer.py", np_)


@pytest.mark.parametrize("np_", [2, 3])
def test_sparsifier_matches_torch_reference(np_):
    """scalecomp through grouped_allreduce_ and DistributedOptimizer equals a plain-torch
    implementation of ScaleCom for 6 steps (a group, and by default an optimizer's whole
    step, travels as one bucket); DistributedOptimizer's groups train correctly."""
    run("torch_sparse_reference.py", np_)


def _run_torchrun_style(mode, out, np_, timeout=180):
    """Ranks started the way torchrun starts them: its variables set by hand (torchrun itself
    does not start on Debian's Python 3.11). braid's rank 0 then hosts the coordinator on
    MASTER_ADDR at BRAID_COORDINATOR_PORT."""
    port, braid_port = braid_launch.free_port(), braid_launch.free_port()
    results = braid_launch.run_without_launcher(
        [braid_launch.PYTHON, str(braid_launch.REPO / "tests/python/workers/torch_ddp_compare.py"),
         mode, str(out)],
        [{"RANK": str(r), "WORLD_SIZE": str(np_), "LOCAL_RANK": str(r),
          "LOCAL_WORLD_SIZE": str(np_), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
          "BRAID_COORDINATOR_PORT": str(braid_port), "GLOO_SOCKET_IFNAME": "lo"}
         for r in range(np_)], timeout=timeout)
    for r, (rc, _) in enumerate(results):
        assert rc == 0, (f"{mode} rank {r} exited with {rc}:\n"
                         + "\n".join(out for _, out in results))


def test_matches_distributed_data_parallel(tmp_path):
    """braid's DistributedOptimizer and DDP (gloo), same model, data, seed and batch split:
    the parameters agree within float32 tolerance after 20 steps, on every rank."""
    _run_torchrun_style("ddp", tmp_path / "ddp", 2)
    res = braid_launch.run_worker("torch_ddp_compare.py", 2, args=("braid", tmp_path / "braid"))
    assert res.returncode == 0, res.output
    ddp = [torch.load(tmp_path / f"ddp.rank{r}.pt") for r in range(2)]
    ours = [torch.load(tmp_path / f"braid.rank{r}.pt") for r in range(2)]
    assert set(ours[0]) == set(ddp[0])
    moved = 0.0
    for name in ddp[0]:
        for r in range(2):
            torch.testing.assert_close(ours[r][name], ddp[0][name], rtol=1e-4, atol=1e-5,
                                       msg=lambda m: f"{name} on rank {r}: {m}")
        assert torch.equal(ours[0][name], ours[1][name]), f"{name}: braid ranks differ"
    # The comparison means something only if training moved the weights.
    torch.manual_seed(0)
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "ddp_compare", braid_launch.REPO / "tests/python/workers/torch_ddp_compare.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    init = mod.Net().state_dict()
    moved = max(float((ours[0][n] - init[n]).abs().max()) for n in init)
    assert moved > 1e-2, f"parameters barely moved ({moved}): the comparison is vacuous"


def test_torchrun_style_launch(tmp_path):
    """braid.torch started as torchrun starts ranks (RANK, WORLD_SIZE, MASTER_ADDR, ...; no
    braidrun) trains like under braidrun: the same parameters on both ranks."""
    _run_torchrun_style("braid", tmp_path / "tr", 2)
    ranks = [torch.load(tmp_path / f"tr.rank{r}.pt") for r in range(2)]
    for name in ranks[0]:
        assert torch.equal(ranks[0][name], ranks[1][name]), name


SINGLE = r"""
import inspect, os, torch, braid.torch as hvd
for n in hvd.__all__:
    obj = getattr(hvd, n)
    if inspect.isfunction(obj) or inspect.isclass(obj):
        assert obj.__doc__, f"braid.torch.{n} has no docstring"
# Horovod's signatures (parameter names in order, as horovod.torch 0.28 declares them): a
# script calling with Horovod's positional or keyword arguments means the same here.
HOROVOD = {
    "allreduce": "tensor average name compression op prescale_factor postscale_factor process_set",
    "allreduce_": "tensor average name op prescale_factor postscale_factor process_set",
    "allreduce_async": "tensor average name op prescale_factor postscale_factor process_set",
    "allreduce_async_": "tensor average name op prescale_factor postscale_factor process_set",
    "grouped_allreduce":
        "tensors average name compression op prescale_factor postscale_factor process_set",
    "grouped_allreduce_": "tensors average name op prescale_factor postscale_factor process_set",
    "grouped_allreduce_async":
        "tensors average name op prescale_factor postscale_factor process_set",
    "grouped_allreduce_async_":
        "tensors average name op prescale_factor postscale_factor process_set",
    "allgather": "tensor name process_set", "allgather_async": "tensor name process_set",
    "broadcast": "tensor root_rank name process_set",
    "broadcast_": "tensor root_rank name process_set",
    "broadcast_async": "tensor root_rank name process_set",
    "broadcast_async_": "tensor root_rank name process_set",
    "alltoall": "tensor splits name process_set",
    "alltoall_async": "tensor splits name process_set",
    "reducescatter": "tensor name compression op process_set prescale_factor postscale_factor",
    "reducescatter_async": "tensor name op process_set prescale_factor postscale_factor",
    "init": "comm process_sets", "synchronize": "handle", "poll": "handle", "barrier": "process_set", "join": "device process_set",
    "broadcast_parameters": "params root_rank process_set",
    "broadcast_optimizer_state": "optimizer root_rank model process_set",
    "broadcast_object": "obj root_rank name process_set",
    "allgather_object": "obj name process_set",
    "DistributedOptimizer": "optimizer named_parameters compression backward_passes_per_step op "
                            "gradient_predivide_factor num_groups groups sparse_as_dense "
                            "process_set",
}
for fn, want in HOROVOD.items():
    got = list(inspect.signature(getattr(hvd, fn)).parameters)
    assert got[:len(want.split())] == want.split(), f"{fn}{inspect.signature(getattr(hvd, fn))}"
for kwargs, words in (({"comm": [0]}, "comm=[0]"), ({"process_sets": "static"}, "dynamic")):
    try:
        hvd.init(**kwargs)
        raise AssertionError(f"init({kwargs}) did not raise")
    except hvd.InvalidArgumentError as e:
        assert words in str(e) and not hvd.is_initialized(), (kwargs, str(e))
os.environ["BRAID_DYNAMIC_PROCESS_SETS"] = "yes"
try:
    hvd.init()
    raise AssertionError("BRAID_DYNAMIC_PROCESS_SETS=yes did not raise")
except hvd.InvalidArgumentError as e:
    assert "BRAID_DYNAMIC_PROCESS_SETS='yes'" in str(e) and not hvd.is_initialized(), str(e)
del os.environ["BRAID_DYNAMIC_PROCESS_SETS"]
hvd.init(comm=None, process_sets=[])
try:
    hvd.add_process_set([0])
    raise AssertionError("add_process_set without dynamic sets did not raise")
except hvd.FailedPreconditionError as e:
    assert "dynamic" in str(e), str(e)
assert (hvd.size(), hvd.rank(), hvd.cross_size(), hvd.cross_rank()) == (1, 0, 1, 0)
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
ref = torch.nn.Linear(4, 2)
ref.load_state_dict(model.state_dict())
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                               named_parameters=model.named_parameters(),
                               compression=hvd.Compression.fp4)
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
gps = hvd.global_process_set
hvd.broadcast_parameters(model.state_dict(), 0, process_set=gps)
hvd.broadcast_optimizer_state(opt, 0, model=model, process_set=gps)
assert hvd.broadcast_object({"a": 1}, 0, process_set=gps) == {"a": 1}
assert hvd.allgather_object(3, process_set=gps) == [3]
try:
    hvd.broadcast_object(lambda: 1, 0)
    raise AssertionError("an unpicklable object was broadcast")
except hvd.InvalidArgumentError as e:  # the same error as in a larger world
    assert "failed on rank(s) [0]: rank 0 could not pickle its object" in str(e), e
assert not opt._grad_accs, "hooks registered in a world of one rank"
for step in range(3):
    x = torch.randn(5, 4)
    for m, o in ((model, opt), (ref, ref_opt)):
        o.zero_grad()
        m(x).pow(2).sum().backward()
        o.step()
for p, q in zip(model.parameters(), ref.parameters()):
    assert torch.equal(p, q), "a world of one rank changed the update"
assert hvd.compression_stats()["tensors"] == {}, "a world of one rank communicated"
print("single OK", flush=True)
"""


def test_world_of_one_skips_communication():
    """No launcher: size 1; DistributedOptimizer adds no hooks, sends nothing and updates
    exactly as the wrapped optimizer (even with fp4 compression asked for)."""
    build = braid_launch.build_dir()
    env = braid_launch.rank_env(build)
    p = subprocess.run([braid_launch.PYTHON, "-c", SINGLE], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and "single OK" in p.stdout, p.stdout + p.stderr


def test_parameters_frozen_or_unused_on_some_ranks():
    """workers/torch_trainable.py on 2 ranks (BRAID_NEGOTIATION_TIMEOUT_S=2): layers frozen
    and unfrozen between steps (at wrapping, mid-training; SGD, Adam, bucket views, groups,
    PowerSGD) and sparse gradients some ranks lack train as one process does; ranks that
    disagree on a frozen layer, or on a sparse gradient, fail together at once."""
    res = braid_launch.run_worker("torch_trainable.py", 2, timeout=120,
                                  env={"BRAID_NEGOTIATION_TIMEOUT_S": "2"})
    assert res.returncode == 0, res.output
    for r in range(2):
        assert f"rank {r}: all checks passed" in res.output, res.output
