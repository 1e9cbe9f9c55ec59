"""`nvidia-smi topo -m` parser on cases modelled on real outputs (see each fixture's first line)."""
from __future__ import annotations

import pytest

from topology.smi_parse import TopoParseError, parse_topo_matrix, read_smi_file


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
    ("\tGPU0\tGPU1\tCPU Affinity\n", 1, "no link between them could be read (no GPU row"),
    ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tQQQ\t0-7\nGPU1\tZZZ\t X \t0-7\n", 1,
     "(line 2: row GPU0 has unknown link 'QQQ'"),
    ("\tGPU0\tGPU2\tCPU Affinity\nGPU0\t X \tSYS\t0-7\n", 1, "not GPU0..GPUn in order"),
])
def test_nothing_recognisable_is_rejected_naming_the_line(text, line, words):
    with pytest.raises(TopoParseError) as e:
        parse_topo_matrix(text)
    msg = str(e.value)
    assert msg.startswith(f"line {line}:") and words in msg and "\n" not in msg


@pytest.mark.parametrize("text,links,gpu,note", [
    # a row missing: its links come from the other GPU's row, its affinity is unknown
    (GOOD.replace("GPU1\tSYS\t X \t8-15\t1\n", ""), {"0-1": "SYS"}, (1, None, None),
     "line 2: header names 2 GPUs but 1 GPU rows follow (no row for GPU1)"),
    # an unknown level holds its cell's place; the pair is read from GPU1's row
    (GOOD.replace("\tSYS\t0-7", "\tFOO\t0-7"), {"0-1": "SYS"}, (0, "0-7", 0),
     "line 2: row GPU0 has unknown link 'FOO'"),
    (GOOD.replace("GPU1\tSYS\t X ", "GPU1\tPIX\t X "), {}, (1, "8-15", 1),
     "line 3: GPU1->GPU0 is PIX but GPU0->GPU1 is SYS (matrix not symmetric); link unknown"),
    (GOOD.replace("GPU0\t X ", "GPU0\tSYS"), {"0-1": "SYS"}, (0, "0-7", 0),
     "line 2: row GPU0 has no X on its diagonal"),
    (GOOD.replace("\t8-15\t1\n", "\t8-15\n"), {"0-1": "SYS"}, (1, None, None),
     "line 3: row GPU1 has 1 values after the links for 2 columns"),
    (GOOD.replace("\t8-15\t1", "\tabc\t1"), {"0-1": "SYS"}, (1, None, 1),
     "line 3: row GPU1 CPU affinity 'abc' is not a CPU list; left unknown"),
    (GOOD.replace("\t0\nGPU1", "\tzero\nGPU1"), {"0-1": "SYS"}, (0, "0-7", None),
     "line 2: row GPU0 NUMA Affinity 'zero' is neither a number nor N/A"),
    (GOOD.replace("GPU1\tSYS", "GPU2\tSYS"), {"0-1": "SYS"}, (1, None, None),
     "line 3: row GPU2 but the header names 2 GPUs; skipped"),
    (GOOD.replace("\tCPU Affinity\tNUMA Affinity", ""), {"0-1": "SYS"}, (0, None, None),
     "line 1: header has no CPU Affinity / NUMA Affinity columns"),
    ("GPU1\tSYS\n" + GOOD, {"0-1": "SYS"}, (1, "8-15", 1),
     "line 1: GPU row before the header line; skipped"),
])
def test_partly_readable_text_is_read_and_says_what_it_skipped(text, links, gpu, note):
    t = parse_topo_matrix(text)
    assert t.links == links
    assert t.unknown_pairs == (() if links else ("0-1",))
    g = t.gpus[gpu[0]]
    assert (g.index, g.cpu_affinity, g.numa_node) == gpu
    assert any(n.startswith(note) for n in t.notes), t.notes
    assert all("\n" not in n for n in t.notes)


def test_slurm_empty_cpu_affinity_with_tabs(fixtures):
    # rapidsai/dask-cuda#1381: `srun -c32`, GPUs 4-7 outside the cpuset: two tabs in a row
    t = load(fixtures, "slurm_empty_cpu_affinity_tabs")
    assert len(t.links) == 28 and t.unknown_pairs == () and t.nics == ("NIC0",)
    assert t.links["0-1"] == "NV12" and t.links["2-4"] == "SYS" and t.links["4-6"] == "NODE"
    assert [g.cpu_affinity for g in t.gpus] == ["0-15,56-71"] * 4 + [None] * 4
    assert [g.numa_node for g in t.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(g.gpu_numa_id is None for g in t.gpus)
    assert t.notes == tuple(f"line {7 + k}: row GPU{4 + k} has an empty CPU Affinity (as printed "
                            "inside a Slurm/cgroup allocation); left unknown" for k in range(4))


def test_slurm_empty_cpu_affinity_pasted_with_spaces(fixtures):
    # the same table after the tabs became spaces: NUMA Affinity and GPU NUMA ID right-aligned
    tabs = load(fixtures, "slurm_empty_cpu_affinity_tabs")
    t = load(fixtures, "slurm_empty_cpu_affinity_spaces")
    assert t.links == tabs.links and t.gpus == tabs.gpus
    assert len(t.notes) == 4 and "each value placed in the column it fits" in t.notes[0]
    assert t.notes[0].startswith("line 8: row GPU4 has no CPU Affinity value")


def test_glued_columns_prompt_and_blank_line(fixtures):
    # vllm-project/vllm#13855: NIC8NIC9 in the header, NODEPXB / NODENODE in rows GPU4..7
    t = load(fixtures, "dgx_h100_glued_columns_prompt")
    assert len(t.nics) == 12 and t.nics[8:10] == ("NIC8", "NIC9")
    assert set(t.links.values()) == {"NV18"} and len(t.links) == 28
    assert [g.numa_node for g in t.gpus] == [0] * 4 + [1] * 4
    assert t.gpus[7].cpu_affinity == "56-111,168-223"   # read after the re-split cells
    assert t.notes[0] == ("line 4: header cell 'NIC8NIC9' read as NIC8, NIC9 (a lost tab glued "
                          "two columns)")
    assert "row GPU6 cell 'NODEPXB' read as NODE, PXB" in t.notes[3]


def test_hand_trimmed_numa_notes_and_a_shifted_row(fixtures):
    t = load(fixtures, "readme_trimmed_numa_notes_shifted_row")
    assert t.columns == () and [g.numa_node for g in t.gpus] == [0] * 4 + [1] * 4
    # GPU5's row lost a cell before its X: what lies after the X is kept (5-6, 5-7), what
    # lies before it is taken from rows GPU0..4
    assert t.links["4-5"] == "PIX" and t.links["5-6"] == "NODE" and t.links["3-5"] == "SYS"
    assert t.links["0-1"] == "PIX" and t.links["6-7"] == "PIX" and t.unknown_pairs == ()
    assert t.notes[1] == ("line 12: row GPU5 has 7 link entries for 8 columns (a row shifted by a "
                          "column?); re-aligned on its X, entries before the diagonal unknown")


def test_table_kept_as_comments_in_a_job_script(fixtures):
    t = load(fixtures, "job_script_comment_4gpu_nv4")
    assert set(t.links.values()) == {"NV4"} and len(t.links) == 6 and t.notes == ()
    assert [(g.cpu_affinity, g.numa_node) for g in t.gpus] == [
        ("48-63,112-127", 3), ("32-47,96-111", 2), ("16-31,80-95", 1), ("0-15,64-79", 0)]


def test_markdown_table_and_unrecoverable_pairs():
    md = ("| | GPU0 | GPU1 | GPU2 | CPU Affinity |\n|---|---|---|---|---|\n"
          "| GPU0 | X | NV4 | SYS | 0-7 |\n| GPU1 | NV4 | X | | 0-7 |\n"
          "| GPU2 | SYS | | X | 8-15 |\n")
    t = parse_topo_matrix(md)
    # cells between pipes are exact: the blank 1-2 cell is blank in both rows, so unknown
    assert t.links == {"0-1": "NV4", "0-2": "SYS"} and t.unknown_pairs == ("1-2",)
    assert [g.cpu_affinity for g in t.gpus] == ["0-7", "0-7", "8-15"]
    assert t.notes[-1] == "1 GPU pair(s) with no readable link: 1-2"


def test_read_smi_file_caps_and_binary(tmp_path):
    with pytest.raises(TopoParseError, match="/dev/zero: a character device"):
        read_smi_file("/dev/zero")
    (tmp_path / "b.txt").write_bytes(b"\tGPU0\x00\x01\xff")
    with pytest.raises(TopoParseError, match="binary data"):
        read_smi_file(tmp_path / "b.txt")
    with pytest.raises(TopoParseError, match="a directory"):
        read_smi_file(tmp_path)


def test_h200_pair_nvlink_vm(fixtures):
    # recorded on the 2x H200 machine of docs/BENCHMARKS.md: ANSI-underlined tab header, " X "
    # diagonal, an empty cell before `GPU NUMA ID` (N/A), both GPUs on NUMA node 0, no NICs
    t = load(fixtures, "h200x2_nv18_vm")
    assert t.links == {"0-1": "NV18"} and t.nics == ()
    assert t.columns == ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
    assert [(g.index, g.cpu_affinity, g.numa_node, g.gpu_numa_id) for g in t.gpus] == [
        (0, "0-31", 0, None), (1, "0-31", 0, None)]
