"""The communication-bound benchmark's smoke run (tools/bench/comm_bound_bench.py --smoke): 2
test hosts on 100 Mbit/s links, a few steps of every method, a one-configuration step matrix
and a 3-size all-reduce sweep (braid, gloo, Open MPI). It asserts that every run completed
and was reported (table and plots, the uncompressed step beside its floor), and facts that
hold at any speed: every braid run's data plane used tcp between the hosts, and the
compressed methods put fewer bytes on the wire than the uncompressed ones.
"""

import json
import subprocess

import hosts as testhosts

BENCH = testhosts.REPO / "tools" / "bench" / "comm_bound_bench.py"


def test_smoke(tmp_path):
    testhosts.require("ip", "tc", "unshare", "nsenter", "setsid", "sshd", "ssh", "ssh-keygen",
                      "mpirun")
    build = testhosts.build_dir()
    r = subprocess.run([testhosts.PYTHON, str(BENCH), "--smoke", "--build-dir", str(build),
                        "--out", str(tmp_path)], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=400)
    assert r.returncode == 0, r.stdout
    res = json.loads((tmp_path / "results.json").read_text())
    runs = {x["method"]: x for x in res["accuracy_runs"]}
    assert list(runs) == ["none", "fp16", "fp4", "powersgd:rank=2", "scalecomp:ratio=100",
                          "ddp", "ddp-powersgd:2", "local"]
    for m, x in runs.items():
        assert "error" not in x, (m, x)
        assert x["ranks"] == 2 and x["steps"] == 6, (m, x)
        assert [h["step"] for h in x["history"]] == [3, 6], (m, x)
        assert 0.0 <= x["final_test_accuracy"] <= 1.0
        assert x["step_time_median_s"] > 0
        if x["framework"] == "braid":
            assert x["transports"] == "ucx tcp/eth0", (m, x)
            assert x["transport_bytes"] > 0 and x["payload_bytes"] > 0
    # Bytes on the link (eth0 counters, headers included) follow the compression.
    wire = {m: x["wire_bytes"] for m, x in runs.items()}
    assert wire["local"] < 0.01 * wire["none"], wire
    for m in ("fp16", "fp4", "powersgd:rank=2", "scalecomp:ratio=100"):
        assert wire[m] < 0.7 * wire["none"], wire
    assert wire["ddp-powersgd:2"] < wire["ddp"], wire
    assert [(x["method"], x["ranks"]) for x in res["matrix_runs"]] == [("none", 2), ("ddp-fp16", 2)]
    # The floor's inputs: the CNN's 215,370 float32 parameters, and the phases timed apart.
    none = res["matrix_runs"][0]
    assert none["gradient_bytes"] == 861480, none
    assert 0 < none["forward_median_s"] + none["update_median_s"] < none["step_time_median_s"]
    # Each rank sends at least what the all-reduce needs per timed step: 2(n-1)/n of the
    # gradient, plus headers (eth0's counter sees GSO packets: fewer headers than frames).
    assert none["wire_bytes_timed"] / none["timed_steps"] / 2 >= 861480, none
    table = (tmp_path / "table.md").read_text()
    assert "### Against the floor (uncompressed methods)" in table, table
    assert "| 2 ranks 100mbit | braid none | " in table, table
    for label in ("braid none", "braid powersgd:rank=2", "DDP gloo", "DDP powerSGD_hook rank 2",
                  "DDP fp16_compress_hook", "no communication"):
        assert f"| {label} |" in table, table
    sweep = {x["framework"]: x for x in res["sweep"]}
    assert list(sweep) == ["braid", "gloo", "openmpi"], res["sweep"]
    for fw, x in sweep.items():
        assert "error" not in x, (fw, x)
        assert [row["bytes"] for row in x["rows"]] == [4096, 16384, 65536], (fw, x)
        assert all(row["wrong"] == 0 and row["busbw_gbps"] > 0 for row in x["rows"]), (fw, x)
    assert "| 65536 | " in table
    for png in ("accuracy_2x100mbit.png", "steps.png", "sweep.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
