"""For PyTorch DDP users: the `braid` torch.distributed backend (braid.torch.distributed) and
braid's DDP communication hook (braid.torch.ddp_comm_hook), end to end on real ranks.

The ranks run workers/torch_c10d.py; DDP trains the Fashion-MNIST example's CNN for 20 steps
on the dataset's first images, the same seed, data and split on every backend.
"""

import subprocess

import pytest
import torch

import braid_launch

WORKER = "torch_c10d.py"
STEPS = 20


def _run(np_, *args, timeout=180):
    res = braid_launch.run_worker(WORKER, np_, args=args, timeout=timeout,
                                  env={"GLOO_SOCKET_IFNAME": "lo"})
    assert res.returncode == 0, f"{WORKER} {args} on {np_} ranks:\n{res.output}"
    for r in range(np_):
        assert f"rank {r}: all checks passed" in res.output, res.output
    return res


def _ddp(tmp_path, np_, backend, tag, *options):
    out = tmp_path / tag
    _run(np_, "ddp", backend, out, *options)
    return [torch.load(f"{out}.rank{r}.pt") for r in range(np_)]


def _reference(tmp_path, np_):
    """The canonical-order reference (workers/torch_c10d.py reference), in the ranks'
    environment."""
    out = tmp_path / f"reference{np_}"
    env = braid_launch.rank_env(braid_launch.build_dir(), {"BRAID_RANK": "0"})
    script = braid_launch.REPO / "tests/python/workers" / WORKER
    res = subprocess.run([braid_launch.PYTHON, str(script), "reference", str(np_), str(out)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)
    assert res.returncode == 0, res.stdout.decode(errors="replace")
    return torch.load(f"{out}.pt")["params"]


def _same_on_every_rank(runs):
    for name, value in runs[0]["params"].items():
        for r, run in enumerate(runs[1:], 1):
            assert torch.equal(run["params"][name], value), f"{name}: rank {r} differs"


def _relative(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("np_", [2, 3])
def test_collectives(np_):
    """Every collective of the backend against a reference computed from every rank's inputs
    (all ops and dtypes, views, async futures, coalesced, roots, uneven all-to-all, bytes for
    dtypes braid does not reduce); unsupported calls raise naming the operation; a refusal
    on one rank fails every rank with its reason, and the next call pairs as before."""
    _run(np_, "collectives")


def _run_without_launcher(args, envs, drop=()):
    """The worker with `args`, one process per environment of `envs`, no launcher; every
    process must exit 0."""
    results = braid_launch.run_without_launcher(
        [braid_launch.PYTHON, str(braid_launch.REPO / "tests/python/workers" / WORKER), *args],
        envs, drop=drop)
    for r, (rc, _) in enumerate(results):
        assert rc == 0, f"rank {r}:\n" + "\n".join(out for _, out in results)


def test_collectives_torchrun_style(tmp_path):
    """init_process_group("braid") with torch's own env:// variables (as torchrun sets them),
    braid finding its coordinator from the same variables."""
    port, braid_port = braid_launch.free_port(), braid_launch.free_port()
    _run_without_launcher(["collectives"], [{
        "RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        "BRAID_COORDINATOR_PORT": str(braid_port)} for r in range(2)])


def test_collectives_rank_given_to_torch(tmp_path):
    """init_process_group("braid", init_method="tcp://...", rank=r, world_size=n) in
    processes no launcher started (mp.spawn's pattern): braid takes torch's rank, world size
    and store address."""
    _run_without_launcher(["collectives", f"tcp://127.0.0.1:{braid_launch.free_port()}"],
                          [{"TEST_RANK": str(r), "TEST_WORLD_SIZE": "2"} for r in range(2)],
                          drop=("MASTER_ADDR", "MASTER_PORT"))


def test_ddp_matches_gloo_at_two_ranks(tmp_path):
    """DDP over braid and over gloo: bit-identical parameters after 20 steps at 2 ranks (a
    sum of two is the same in every order); braid's counters hold every DDP bucket's bytes,
    so a backend that handed the work to gloo would fail here."""
    gloo = _ddp(tmp_path, 2, "gloo", "gloo")
    braid = _ddp(tmp_path, 2, "braid", "braid")
    _same_on_every_rank(braid)
    for name, value in gloo[0]["params"].items():
        assert torch.equal(braid[0]["params"][name], value), f"{name}: braid != gloo"
    init = braid[0]["losses"][0]
    assert braid[0]["losses"][-1] < init - 0.05, braid[0]["losses"]  # training moved
    for r, run in enumerate(braid):
        ours = {n: t for n, t in run["stats"]["tensors"].items() if n.startswith("c10d.")}
        assert sum(t["uncompressed_bytes"] for t in ours.values()) == STEPS * run["param_bytes"], (
            f"rank {r}: braid all-reduced {ours}, DDP's buckets hold "
            f"{STEPS} x {run['param_bytes']} bytes")
        assert sum(t["reductions"] for t in ours.values()) >= STEPS
        assert all(t["method"] == "none" for t in ours.values())


@pytest.mark.parametrize("np_", [3, 4])
def test_ddp_canonical_order(tmp_path, np_):
    """At 3 and 4 ranks DDP over braid is bit-identical to the gradients summed in braid's
    canonical order, and within 1e-6 (relative) of DDP over gloo, which sums in its ring's
    order."""
    reference = _reference(tmp_path, np_)
    braid = _ddp(tmp_path, np_, "braid", "braid")
    gloo = _ddp(tmp_path, np_, "gloo", "gloo")
    _same_on_every_rank(braid)
    differs = 0
    for name, want in reference.items():
        assert torch.equal(braid[0]["params"][name], want), (
            f"{name}: braid differs from the canonical order by "
            f"{_relative(braid[0]['params'][name], want):.3g}")
        rel = _relative(braid[0]["params"][name], gloo[0]["params"][name])
        assert rel < 1e-6, f"{name}: braid and gloo differ by {rel:.3g} (relative)"
        differs += not torch.equal(gloo[0]["params"][name], want)
    # gloo's order is not braid's: the bit-for-bit check above is not vacuous.
    assert differs > 0, "gloo summed in braid's order: the reference proves nothing"


def _powersgd_payload(shape, rank):
    """PowerSGD's bytes per step for one float32 gradient (Vogels et al. 2019, Alg. 1): P (n x r)
    and Q (m x r) for a gradient viewed as n x m; vectors go uncompressed."""
    numel = 1
    for d in shape:
        numel *= d
    if len(shape) < 2:
        return 4 * numel
    n, m = shape[0], numel // shape[0]
    return 4 * rank * (n + m) if rank * (n + m) < n * m else 4 * numel


def test_ddp_powersgd_hook(tmp_path):
    """DDP with braid's hook and powersgd:rank=2 over several buckets (rebuilt after the first
    step): the loss falls, every parameter's gradient travels under its own name with
    PowerSGD's payload, and every rank ends with the same parameters."""
    runs = _ddp(tmp_path, 2, "braid", "powersgd", "hook=powersgd:rank=2", "lr=0.05",
                "bucket_cap_mb=0.2")
    _same_on_every_rank(runs)
    losses = runs[0]["losses"]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.1, losses
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "train_fashion_mnist", braid_launch.REPO / "examples/train_fashion_mnist.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    shapes = {n: tuple(p.shape) for n, p in mod.Net().named_parameters()}
    for r, run in enumerate(runs):
        tensors = run["stats"]["tensors"]
        for name, shape in shapes.items():
            t = tensors[f"ddp0.{name}"]
            assert t["method"] == "powersgd:rank=2" and t["reductions"] == STEPS, (r, name, t)
            assert t["payload_bytes"] == STEPS * _powersgd_payload(shape, 2), (r, name, t)
        assert not any(n.startswith("c10d.") for n in tensors), \
            "the buckets went through the process group too"


def test_ddp_hook_options_match_gloo(tmp_path):
    """braid's hook (uncompressed) with gradient_as_bucket_view=True, static_graph=True and
    no_sync() on every other step: bit-identical to plain DDP over gloo with the same options
    at 2 ranks, so the hook writes every bucket where DDP reads it."""
    options = ("bucket_view", "static_graph", "no_sync", "bucket_cap_mb=0.2")
    gloo = _ddp(tmp_path, 2, "gloo", "gloo", *options)
    hooked = _ddp(tmp_path, 2, "braid", "hook", "hook=none", *options)
    _same_on_every_rank(hooked)
    for name, value in gloo[0]["params"].items():
        assert torch.equal(hooked[0]["params"][name], value), f"{name}: hook != gloo"


def test_torch_powersgd_hook_on_a_braid_group(tmp_path):
    """torch's own powerSGD_hook, whose callbacks wait on further collectives of the group,
    on the braid backend: no hang, and at 2 ranks the same parameters as on gloo."""
    gloo = _ddp(tmp_path, 2, "gloo", "gloo", "torch_powersgd", "bucket_cap_mb=0.2")
    braid = _ddp(tmp_path, 2, "braid", "braid", "torch_powersgd", "bucket_cap_mb=0.2")
    _same_on_every_rank(braid)
    for name, value in gloo[0]["params"].items():
        assert torch.equal(braid[0]["params"][name], value), f"{name}: braid != gloo"


def test_group_destroyed_by_its_own_callback():
    """The group's last reference dropped on the group's own thread (a future's callback that
    outlives destroy_process_group(), as torch's powerSGD_hook's closures may): the group
    stops without joining the thread it runs on (which aborts the process with 'Resource
    deadlock avoided') and the ranks exit cleanly."""
    _run(2, "last_reference", timeout=60)


def test_killed_rank_raises_everywhere():
    """A rank SIGKILLed during DDP's steps: every other rank's backward raises RuntimeError
    (braid.UnavailableError naming the lost rank) within the timeouts instead of hanging."""
    res = braid_launch.run_worker(WORKER, 3, args=("killed",), timeout=120)
    assert "rank 2: killing itself" in res.output, res.output
    for r in (0, 1):
        assert f"rank {r}: all checks passed" in res.output, res.output


def test_backend_compression_and_plans():
    """The backend's method: BRAID_C10D_COMPRESSION, else BRAID_COMPRESSION; a plan there
    (compression per layer, matched by name) is the framework's: the backend, whose
    collectives have a new name every call, runs none for it and refuses one of its own.
    One process (importing torch is the cost), the variables set in turn."""
    program = """
import os
import braid.torch.distributed as bd
for job, c10d in (("fp16", None), ('{"*.bias": "none", "*": "powersgd"}', None),
                  ("fp16", '{"*": "fp16"}'), ("none", "powersgd")):
    os.environ["BRAID_COMPRESSION"] = job
    os.environ.pop("BRAID_C10D_COMPRESSION", None)
    if c10d is not None:
        os.environ["BRAID_C10D_COMPRESSION"] = c10d
    try:
        print(bd.backend_compression())
    except bd.InvalidArgumentError as e:
        print("refused:", e)
"""
    env = braid_launch.rank_env(braid_launch.build_dir())
    out = subprocess.run(["/usr/bin/python3", "-c", program], env=env, text=True,
                         capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().split("\n")
    assert lines[:2] == ["fp16", "none"], lines
    assert lines[2].startswith("refused: the braid torch.distributed backend cannot all-reduce "
                               "with a compression plan"), lines
    assert lines[3].startswith("refused:") and "keeps state per tensor" in lines[3], lines
