"""Two tiers: CPU tests always run; tests marked `gpu` are skipped without an NVIDIA GPU."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


def _gpu_count() -> int:
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


# Without a GPU, Triton kernels run in Triton's interpreter on the CPU; it must be chosen before
# triton is first imported, so it is set here, ahead of every test module.
if not shutil.which("nvidia-smi"):
    os.environ.setdefault("TRITON_INTERPRET", "1")


# The report's disk cache (reports/base/disk_cache.py) is off in tests: a test that patches the
# model must never read a run made without the patch, nor write to the user's ~/.cache. The
# cache's own tests turn it on in a temporary folder.
os.environ["PPSCOPE_CACHE"] = "off"


def pytest_collection_modifyitems(config, items):
    n = _gpu_count()
    skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU")
    skip_multi = pytest.mark.skip(reason="needs two or more NVIDIA GPUs")
    skip_lab = pytest.mark.skip(reason="the live SGLang lab runs with PPSCOPE_LAB=1 "
                                "(make sglang-lab-test)")
    for item in items:
        if "sglang_lab" in item.keywords and os.environ.get("PPSCOPE_LAB") != "1":
            item.add_marker(skip_lab)
        if "gpu" in item.keywords and n < 1:
            item.add_marker(skip_gpu)
        if "multigpu" in item.keywords and n < 2:
            item.add_marker(skip_multi)


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


# ---- shared fakes and checks: fixtures here, so that no test module imports another ----------

def _gpu(i, numa):
    from topology.discover import GpuInfo
    return GpuInfo(index=i, name="NVIDIA RTX PRO 6000 Blackwell Server Edition", uuid=f"GPU-{i}",
                   pci_bus_id=f"0000:{0x10 + i:02x}:00.0", memory_bytes=97_887_000_000,
                   pcie_gen_current=5, pcie_gen_max=5, pcie_width_current=16,
                   pcie_width_max=16, numa_node=numa, cpu_affinity="0-31" if numa == 0 else "32-63")


@pytest.fixture
def fake_discovery():
    """Three RTX PRO 6000s on two sockets (GPUs 0 and 1 under one switch on socket 0, GPU 2 on
    socket 1); GPUs 1 and 2 have no P2P read."""
    from topology.discover import Discovery
    return Discovery(gpus=(_gpu(0, 0), _gpu(1, 0), _gpu(2, 1)),
                     links={"0-1": "PIX", "0-2": "SYS", "1-2": "SYS"},
                     p2p_support={"0-1": {"read": "OK", "write": "OK"},
                                  "0-2": {"read": "OK", "write": "OK"},
                                  "1-2": {"read": "chipset not supported", "write": "OK"}},
                     sockets=2, numa_nodes=2, links_source="nvidia-smi", driver="580.65.06")


class FakeBench:
    """Stands in for topology.p2p.Bench: fixed numbers so the orchestration is checked. Like
    the real one, a host-staged copy is timed without the spin blocker (`spin_blocked`)."""

    def __init__(self, devices, cfg):
        self.cfg = cfg

    def unidirectional(self, i, j, read=False, staged=False):
        return {"bytes": 100, "bandwidth_gbps": 50.0 + i + (0.5 if read else 0.0),
                "spin_blocked": not staged}

    def latency(self, i, j, staged=False):  # a staged latency is marked by +100 us
        return {"bytes": 16, "latency_us": 2.0 + j + (100.0 if staged else 0.0)}

    def bidirectional(self, i, j, staged=False):
        return {"bytes": 200, "bandwidth_gbps": 90.0, "spin_blocked": not staged}

    def host(self, d):
        return [{"gpu": d, "direction": x, "status": "ok", "bandwidth_gbps": 25.0}
                for x in ("h2d", "d2h")]

    def ring(self, pairs):
        return [{"src": s, "dst": d, "bytes": 100, "time_us": 4.0, "bandwidth_gbps": 25.0}
                for s, d in pairs]


@pytest.fixture
def fake_machine(monkeypatch, fake_discovery):
    """The fake discovery's three GPUs with FakeBench copies; GPUs 1 and 2 have no P2P."""
    import contextlib

    import topology.discover as disc_mod
    import topology.p2p as p2p_mod
    monkeypatch.setattr(disc_mod, "discover", lambda: fake_discovery)
    monkeypatch.setattr(p2p_mod, "Bench", FakeBench)
    monkeypatch.setattr(p2p_mod, "device_count", lambda: 3)
    monkeypatch.setattr(p2p_mod, "device_bus_ids",
                        lambda n: [g.pci_bus_id for g in fake_discovery.gpus][:n])
    monkeypatch.setattr(p2p_mod, "can_access_peer", lambda i, j: {i, j} != {1, 2})
    monkeypatch.setattr(p2p_mod, "peer_access", lambda pairs, on: contextlib.nullcontext())
    return p2p_mod


def check_report(rep: dict) -> None:
    """A report.json dict read back as the typed Report (reports/model/report_type.py): every
    field of its type, no key it does not define, and written back to the same dict."""
    import json

    from reports.base.schema import SchemaError
    from reports.model.report_type import Report
    try:
        typed = Report.from_json(rep, strict=True)
    except SchemaError as e:
        raise AssertionError(str(e)) from None
    assert json.dumps(typed.to_json()) == json.dumps(rep), "report.json does not round-trip"


def refuses(read, path: Path, content: str | bytes, match: str) -> None:
    """`read(path)` of a file that holds `content`: a CliError whose message matches `match`."""
    from reports.base.errors import CliError
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(CliError, match=match):
        read(path)


@pytest.fixture
def refused():
    """`refuses`, for a test that reads bad files."""
    return refuses


@pytest.fixture
def check_report_schema():
    """A report dict checked against its type, `check_report` (AssertionError names the field
    that fails)."""
    return check_report


@pytest.fixture
def fake_rank():
    """rank -> one dispatch-probe rank file (microbench/dispatch/probe.py reads them): PP2,
    4 slots, burst C=8 under `sglang`."""
    MS = 1e-3

    def fake_rank(rank: int, offset_s: float) -> dict:
        """PP2, 4 slots, burst C=8 under `sglang`: slot 0 prefills at it 0, decodes at 4, 8, 12.
        Iterations every 1 ms; measured from it 4. Rank 1 gets its input 40 us after rank 0's
        forward ends (the hop)."""
        cols = {k: [] for k in ("it", "slot", "kind", "n", "rows", "measure", "t_start", "t_end",
                                "wait_us", "t_in", "t_fs", "t_fe", "t_se")}
        for it in range(13):
            s, ts = it % 4, it * MS
            busy = s == 0
            kind = "prefill" if it == 0 else ("decode" if busy else "idle")
            cols["it"].append(it)
            cols["slot"].append(s)
            cols["kind"].append(kind)
            cols["n"].append(8 if busy else 0)
            cols["rows"].append((128 if it == 0 else 8) if busy else 0)
            cols["measure"].append(it >= 4)
            cols["t_start"].append(ts)
            cols["t_end"].append(ts + 0.3 * MS)
            cols["wait_us"].append(50.0 if busy and it else 0.0)
            if busy:
                fe0 = ts + 0.7 * MS  # rank 0: in at +0.1, fs at +0.2, fe at +0.7
                t_in = ts + 0.1 * MS if rank == 0 else fe0 + 0.04 * MS
                fs = t_in + (0.1 * MS if rank == 0 else 0.01 * MS)
                fe = fs + 0.5 * MS
                cols["t_in"].append(None if rank == 0 and it == 0 else t_in)
                cols["t_fs"].append(fs)
                cols["t_fe"].append(fe)
                cols["t_se"].append(fe + 0.03 * MS)
            else:
                for k in ("t_in", "t_fs", "t_fe", "t_se"):
                    cols[k].append(None)
        # slot 0's results are processed one iteration before its next visit (it 3, 7, 11)
        res = {"t": [(it + 0.5) * MS for it in (3, 7, 11)], "slot": [0] * 3,
               "kind": ["prefill", "decode", "decode"], "n": [8] * 3, "rows": [128, 8, 8],
               "running": [0, 8, 8], "queue": [0] * 3}
        pt = {"point": {"policy": "sglang", "arrival": "burst", "concurrency": 8}, "rank": rank,
              "slots": 4, "ref_err_us": 3.0, "t_point_start": 0.0 + offset_s, "columns": cols,
              "results": res, "complete": True}
        if rank == 0:
            pt.update(admitted=8, occupancy=[(0.0, [8, 0, 0, 0])], arrivals_s=[0.0] * 8)
        return {"rank": rank, "pp": 2, "device": "X", "info": {"layers_used": 2}, "points": [pt]}

    return fake_rank


@pytest.fixture
def disk_full_for(monkeypatch):
    """`disk_full_for(name)`: from now on a file of that name cannot be staged (ENOSPC), as on a
    full disk, so write_files fails before anything is renamed; `disk_full_for(None)` mends it."""
    import reports.base.records as R
    real = R._stage

    def fail(name):
        def stage(target, content):
            if target.name == name:
                raise OSError(28, "No space left on device")
            return real(target, content)
        monkeypatch.setattr(R, "_stage", stage if name else real)
    return fail
