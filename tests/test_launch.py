import sys
import time

import pytest

from microbench.kit import launch


def test_torchrun_command_shape():
    cmd = launch.torchrun_command(4, "topology.hop", ["--out", "x.json"])
    assert cmd[1:] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                       "-m", "topology.hop", "--out", "x.json"]


def test_repo_env_puts_repo_first(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "elsewhere")
    env = launch.repo_env(FOO="1")
    assert env["PYTHONPATH"].split(":")[:2] == [str(launch.REPO_ROOT), "elsewhere"]
    assert env["FOO"] == "1"


def test_run_group_returns_exit_code(tmp_path):
    rc, timed_out = launch.run_group([sys.executable, "-c", "raise SystemExit(3)"],
                                     launch.repo_env(), timeout_s=30)
    assert (rc, timed_out) == (3, False)


def test_run_group_kills_the_whole_group_on_timeout(tmp_path):
    # the child starts a grandchild that would outlive a plain kill of the child
    marker = tmp_path / "alive"
    grandchild = tmp_path / "grandchild.py"
    grandchild.write_text(f"import time\ntime.sleep(2)\nopen({str(marker)!r}, 'w').write('x')\n")
    child = tmp_path / "child.py"
    child.write_text("import subprocess, sys, time\n"
                     f"subprocess.Popen([sys.executable, {str(grandchild)!r}])\n"
                     "time.sleep(30)\n")
    t0 = time.monotonic()
    rc, timed_out = launch.run_group([sys.executable, str(child)], launch.repo_env(),
                                     timeout_s=0.5, grace_s=2)
    assert timed_out and rc is None
    assert time.monotonic() - t0 < 10
    time.sleep(2.5)
    assert not marker.exists(), "the grandchild survived the timeout"


def test_pyobj_round_trip_size_then_bytes():
    """send_pyobj/recv_pyobj through a fake point-to-point channel: two messages (a long size,
    then uint8 bytes), the object comes back equal."""
    torch = pytest.importorskip("torch")
    from microbench.kit.launch import recv_pyobj, send_pyobj

    class Wire:
        def __init__(self):
            self.sent = []

        def send(self, t, dst, group):
            self.sent.append(t.clone())

        def recv(self, t, src, group):
            t.copy_(self.sent.pop(0))

    meta = [("t0", ("cuda", "torch.bfloat16", (8, 7168))), ("t1", None)]
    wire = Wire()
    send_pyobj(wire, meta, 1, None)
    assert [t.dtype for t in wire.sent] == [torch.long, torch.uint8]
    assert int(wire.sent[0]) == wire.sent[1].numel()
    assert recv_pyobj(wire, 0, None) == meta and wire.sent == []


def test_start_rank_reads_env_binds_gpu_and_times_out_every_group(monkeypatch):
    import datetime

    import torch
    import torch.distributed as dist

    calls = []
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", d)))
    monkeypatch.setattr(dist, "init_process_group",
                        lambda backend, **kw: calls.append((backend, kw["timeout"])))
    monkeypatch.setattr(dist, "new_group", lambda backend, timeout: (backend, timeout))
    rc = launch.start_rank(7.5)
    t = datetime.timedelta(seconds=7.5)
    assert (rc.rank, rc.world, rc.local_rank, str(rc.device)) == (3, 4, 1, "cuda:1")
    assert calls == [("set_device", 1), ("nccl", t)] and rc.gloo == ("gloo", t)
    calls.clear()
    with pytest.raises(RuntimeError, match="world size 4 != configured pp 2"):
        launch.start_rank(7.5, expect_world=2)
    assert calls == []  # checked before any process group is made
