"""braid under the launchers users already run, without braidrun: Open MPI's mpirun (one host,
and two test hosts with -H), torchrun's environment (set by hand: Debian's torchrun cannot
start on Python 3.11; also with torch.distributed's own store on MASTER_PORT beside braid's
coordinator) and Slurm's srun (a one-node cluster started by
tools/testhosts/braid-slurm-cluster). Each finds its coordinator from the launcher's own
variables (docs/launching.md: "Without braidrun"); nothing is shared between hosts but the command line.

Every job runs inside the test hosts, so the default coordinator port (29600) is free there
whatever else runs on the machine.
"""

import re

import hosts as testhosts

JOB = "tests/multihost/workers/job.py"
EXAMPLE = "examples/train_digits.py"
SHM = re.compile(r"\b(sysv|posix|cma)/memory\b")
# Open MPI as root, its daemons started over the test hosts' ssh.
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe",
          "--mca", "plm_rsh_agent", f"ssh -F {testhosts.SSH_DIR}/config"]


def check_job(out, n, hosts_of_ranks, across_hosts):
    res = testhosts.results(out)
    assert sorted(res) == list(range(n)), out
    for k in range(n):
        assert res[k]["size"] == n
        assert res[k]["wrong_elements"] == 0
        assert res[k]["hosts"] == hosts_of_ranks
        t = res[k]["transports"]
        if across_hosts:
            assert "tcp/eth0" in t, res[k]
        else:
            assert "tcp" not in t and SHM.search(t), res[k]
    return res



def _all_succeed(procs, timeout):
    """Every process's (stdout, stderr), after asserting each exited 0; a process still
    running when another fails or the timeout passes is killed."""
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out + err
    return outs

def test_mpirun_one_host(hosts):
    testhosts.require("mpirun")
    py = str(testhosts.build_dir() / "python")
    r = hosts.run("h0", [*MPIRUN, "-np", "4", "-x", f"PYTHONPATH={py}", testhosts.PYTHON, JOB])
    assert r.returncode == 0, r.stdout + r.stderr
    res = check_job(r.stdout, 4, ["h0"] * 4, across_hosts=False)
    assert [res[k]["local_rank"] for k in range(4)] == [0, 1, 2, 3]


def test_mpirun_two_hosts_with_master_addr(hosts):
    testhosts.require("mpirun")
    py = str(testhosts.build_dir() / "python")
    r = hosts.run("h0", [*MPIRUN, "-np", "4", "-H", "h0:2,h1:2", "-x", "MASTER_ADDR=h0",
                         "-x", "MASTER_PORT=29500", "-x", f"PYTHONPATH={py}",
                         testhosts.PYTHON, JOB])
    assert r.returncode == 0, r.stdout + r.stderr
    res = check_job(r.stdout, 4, ["h0", "h0", "h1", "h1"], across_hosts=True)
    # The variables reached the other host through mpirun's -x, nothing else.
    assert res[3]["launcher_vars"] == {"MASTER_ADDR": "h0", "MASTER_PORT": "29500"}
    assert [(res[k]["local_rank"], res[k]["local_size"]) for k in range(4)] == [
        (0, 2), (1, 2), (0, 2), (1, 2)]


def test_mpirun_two_hosts_finds_rank_0_on_mpiruns_host(hosts):
    testhosts.require("mpirun")
    py = str(testhosts.build_dir() / "python")
    r = hosts.run("h0", [*MPIRUN, "-np", "4", "-H", "h0:2,h1:2", "-x", f"PYTHONPATH={py}",
                         testhosts.PYTHON, JOB])
    assert r.returncode == 0, r.stdout + r.stderr
    check_job(r.stdout, 4, ["h0", "h0", "h1", "h1"], across_hosts=True)


def test_torchrun_environment_across_two_hosts(hosts):
    """What torchrun --nnodes 2 --nproc-per-node 2 sets, by hand, for the NumPy example."""
    py = str(testhosts.build_dir() / "python")
    procs = []
    for node in range(2):
        for local in range(2):
            env = {"RANK": node * 2 + local, "WORLD_SIZE": 4, "LOCAL_RANK": local,
                   "LOCAL_WORLD_SIZE": 2, "GROUP_RANK": node, "MASTER_ADDR": "h0",
                   "MASTER_PORT": 29500, "PYTHONPATH": py, "OMP_NUM_THREADS": 1}
            procs.append(hosts.popen(f"h{node}", [testhosts.PYTHON, EXAMPLE, "--epochs", "3"],
                                     env=env))
    outs = _all_succeed(procs, timeout=180)
    rank0 = outs[0][0]
    assert re.search(r"^4 ranks; rank 0's data plane: ucx .*tcp/eth0", rank0, re.M), rank0
    assert SHM.search(rank0), rank0  # rank 1 is on h0 too
    acc = re.search(r"^final test accuracy ([0-9.]+)", rank0, re.M)
    assert acc and float(acc.group(1)) > 0.85, rank0


def test_slurm_srun_four_tasks(hosts):
    testhosts.require("srun", "slurmctld", "slurmd", "munged")
    py = str(testhosts.build_dir() / "python")
    cluster = str(testhosts.REPO / "tools" / "testhosts" / "braid-slurm-cluster")
    r = hosts.run("h0", [cluster, "--timeout", "120", "--", "env", f"PYTHONPATH={py}",
                         "srun", "-n", "4", testhosts.PYTHON, JOB], timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    res = check_job(r.stdout, 4, ["h0"] * 4, across_hosts=False)
    assert sorted(res[k]["local_rank"] for k in range(4)) == [0, 1, 2, 3]
    # The cluster's daemons are gone with it.
    assert hosts.wait_idle(["h0"]) == {}


# torch's store and braid's coordinator side by side: torch.distributed's env:// rendezvous
# binds MASTER_PORT on rank 0's host, and braid's rank 0 hosts its coordinator at the port
# derived from it (docs/launching.md: "Without braidrun"), so neither takes the other's.
TORCH_AND_BRAID = """
import numpy as np, torch, torch.distributed as dist
dist.init_process_group("gloo")
import braid
braid.init()
listening = set()  # TCP ports listening on this host, IPv4 and IPv6
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(table).read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state == "0A":
            listening.add(int(local.rsplit(":", 1)[1], 16))
t = torch.full((4,), float(dist.get_rank() + 1))
dist.all_reduce(t)
x = braid.allreduce(np.full(1000, braid.rank() + 1, np.float32), name="x", op=braid.Sum)
print("RANK", braid.rank(), "TORCH", float(t[0]), "BRAID", float(x.min()), float(x.max()),
      "LISTENING", sorted(p for p in listening if p in (29500, 45884)),
      "TRANSPORT", braid.transport_description(), flush=True)
braid.shutdown()
dist.destroy_process_group()
"""


def test_torch_store_and_braid_coordinator_share_master_port(hosts):
    py = str(testhosts.build_dir() / "python")
    procs = []
    for rank in range(2):
        env = {"RANK": rank, "WORLD_SIZE": 2, "LOCAL_RANK": 0, "LOCAL_WORLD_SIZE": 1,
               "MASTER_ADDR": "h0", "MASTER_PORT": 29500, "GLOO_SOCKET_IFNAME": "eth0",
               "PYTHONPATH": py, "OMP_NUM_THREADS": 1}
        procs.append(hosts.popen(f"h{rank}", [testhosts.PYTHON, "-c", TORCH_AND_BRAID], env=env))
    outs = _all_succeed(procs, timeout=120)
    rank0 = outs[0][0]
    # On h0: torch's store on MASTER_PORT, braid's coordinator on 45884 (derived from 29500).
    assert "RANK 0 TORCH 3.0 BRAID 3.0 3.0 LISTENING [29500, 45884] TRANSPORT ucx tcp/eth0" in rank0, rank0
    assert "RANK 1 TORCH 3.0 BRAID 3.0 3.0 " in outs[1][0], outs[1]
