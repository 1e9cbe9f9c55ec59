"""`nvidia-smi topo -m` parser on cases modelled on real outputs (see each fixture's first line)."""
from __future__ import annotations

import pytest

from topology.smi_parse import TopoParseError, parse_topo_matrix


def load(fixtures, name):
    return parse_topo_matrix((fixtures / "topo" / f"{name}.txt").read_text())


def test_pcie_dual_socket_old_driver(fixtures):
    # kubernetes/kubernetes#53497: spaces, one mlx4 NIC column and row, CPU Affinity only
    t = load(fixtures, "pcie8_dual_socket_mlx4_old_driver")
    assert len(t.gpus) == 8 and t.nics == ("mlx4_0",) and t.columns == ("CPU Affinity",)
    assert t.links["0-1"] == "PIX" and t.links["0-2"] == "PHB" and t.links["3-4"] == "SYS"
    assert t.gpus[5].cpu_affinity == "10-19,30-39"
    assert all(g.numa_node is None for g in t.gpus)  # no NUMA column in that driver era
    assert len(t.links) == 28


def test_rtx4090_tabs_with_nics(fixtures):
    # NVIDIA/go-gpuallocator#17: tabs, " X " diagonal, NIC0/NIC1, empty cell before GPU NUMA ID
    t = load(fixtures, "rtx4090x8_tabs_nics")
    assert set(t.links.values()) == {"SYS"} and len(t.links) == 28
    assert [g.numa_node for g in t.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert t.gpus[7].cpu_affinity == "56-111,168-223" and t.gpus[7].gpu_numa_id is None
    assert t.nics == ("NIC0", "NIC1")


def test_dgx_a100_nvlink_nic_rows_and_legend(fixtures):
    # NVIDIA/nccl#1505: NV12 everywhere, 12 NIC rows, NIC Legend after the matrix
    t = load(fixtures, "dgx_a100_nv12_nic_rows")
    assert set(t.links.values()) == {"NV12"}
    assert [g.numa_node for g in t.gpus] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert t.gpus[4].cpu_affinity == "112-127,240-255" and len(t.nics) == 12


def test_workstation_two_gpus(fixtures):
    # noonghunna/club-3090#1229: 2x RTX 5090, tabs, legend
    t = load(fixtures, "workstation_2x5090")
    assert t.links == {"0-1": "PHB"}
    assert t.gpus[0].cpu_affinity == "0-63" and t.gpus[1].numa_node == 0


def test_five_gpus_two_numa_nodes(fixtures):
    # noonghunna/club-3090#46: GPU0 alone on NUMA 1, the rest PHB/NODE on NUMA 0
    t = load(fixtures, "five_gpu_two_numa")
    assert t.links == {"0-1": "SYS", "0-2": "SYS", "0-3": "SYS", "0-4": "SYS", "1-2": "PHB",
                       "1-3": "NODE", "1-4": "NODE", "2-3": "NODE", "2-4": "NODE", "3-4": "PHB"}
    assert [g.numa_node for g in t.gpus] == [1, 0, 0, 0, 0]


def test_sixteen_gpus_two_digit_indices(fixtures):
    # NVIDIA/nccl-tests#78: GPU10..GPU15, NV6, mlx5_* columns without rows, no NUMA column
    t = load(fixtures, "dgx2_nv6_16gpu_no_numa")
    assert len(t.gpus) == 16 and len(t.links) == 120 and t.links["14-15"] == "NV6"
    assert t.gpus[12].cpu_affinity == "24-47,72-95" and t.nics[-1] == "mlx5_9"


def test_ansi_header_and_misaligned_columns(fixtures):
    # deepseek-ai/DeepEP#60: 14 NICs, NODE inside a socket, SYS across; header underlined
    t = load(fixtures, "hgx8_nics_ansi")
    assert t.links["0-3"] == "NODE" and t.links["3-4"] == "SYS" and t.links["4-7"] == "NODE"
    assert [g.numa_node for g in t.gpus] == [0, 0, 0, 0, 1, 1, 1, 1] and len(t.nics) == 14


def test_rtx_pro_6000_box(fixtures):
    t = load(fixtures, "rtxpro6000x8_pcie")
    assert [t.links[f"{k}-{k + 1}"] for k in range(7)] == ["PIX", "NODE", "PIX", "SYS", "PIX",
                                                         "NODE", "PIX"]


GOOD = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\nGPU0\t X \tSYS\t0-7\t0\nGPU1\tSYS\t X \t8-15\t1\n"


def test_minimal_good_and_na_numa():
    t = parse_topo_matrix(GOOD.replace("\t1\n", "\tN/A\n"))
    assert t.gpus[1].numa_node is None and t.gpus[0].numa_node == 0


def test_old_soc_level_accepted():
    t = parse_topo_matrix(GOOD.replace("SYS", "SOC"))
    assert t.links == {"0-1": "SOC"}


@pytest.mark.parametrize("text,line,words", [
    ("", 1, "no header"),
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", 1,
     "no header"),
    (GOOD.replace("GPU1\tSYS\t X \t8-15\t1\n", ""), 2, "2 GPUs but 1"),
    (GOOD.replace("\tSYS\t0-7", "\tFOO\t0-7"), 2, "unknown link 'FOO'"),
    (GOOD.replace("GPU1\tSYS\t X ", "GPU1\tPIX\t X "), 3, "not symmetric"),
    (GOOD.replace("GPU0\t X ", "GPU0\tSYS"), 2, "diagonal"),
    (GOOD.replace("\t8-15\t1\n", "\t8-15\n"), 3, "1 values after the links, expected 2"),
    (GOOD.replace("\t8-15\t1", "\tabc\t1"), 3, "not a CPU list"),
    (GOOD.replace("\t0\nGPU1", "\tzero\nGPU1"), 2, "NUMA affinity 'zero'"),
    (GOOD.replace("GPU1\tSYS", "GPU2\tSYS"), 3, "expected row GPU1"),
    (GOOD.replace("\tCPU Affinity\tNUMA Affinity", ""), 1, "no 'CPU Affinity'"),
    ("GPU1\tSYS\n" + GOOD, 1, "before the header"),
])
def test_malformed_names_line(text, line, words):
    with pytest.raises(TopoParseError) as e:
        parse_topo_matrix(text)
    msg = str(e.value)
    assert msg.startswith(f"line {line}:") and words in msg and "\n" not in msg


def test_h200_pair_nvlink_vm(fixtures):
    # recorded on the 2x H200 machine of docs/BENCHMARKS.md: ANSI-underlined tab header, " X "
    # diagonal, an empty cell before `GPU NUMA ID` (N/A), both GPUs on NUMA node 0, no NICs
    t = load(fixtures, "h200x2_nv18_vm")
    assert t.links == {"0-1": "NV18"} and t.nics == ()
    assert t.columns == ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
    assert [(g.index, g.cpu_affinity, g.numa_node, g.gpu_numa_id) for g in t.gpus] == [
        (0, "0-31", 0, None), (1, "0-31", 0, None)]
