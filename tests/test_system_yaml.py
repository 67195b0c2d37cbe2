"""System files: malformed or inconsistent ones get one InputError naming the file, the key path
and what was expected (and exit status 2 at the CLI, no traceback); every shipped one loads."""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from marssim.cli import main
from marssim.errors import InputError
from marssim.system import expand_ids, load_system, shipped_systems, system_from_dict

BASE: dict = {
    "name": "tiny",
    "description": "four accelerators on a ring, a switch to the host",
    "designs": {
        "os16": {"dataflow": "os", "pe_rows": 16, "pe_cols": 16, "clock": "1 GHz", "sram": "1 MiB",
                 "sram_bandwidth": "64 GB/s"},
        "ws8": {"dataflow": "ws", "pe_rows": 8, "pe_cols": 8, "clock": "800 MHz", "sram": "512 KiB",
                "sram_bandwidth": "32 GB/s", "energy": {"mac": "1.5 pJ", "sram_byte": "2.5 pJ"}},
    },
    "accelerators": [{"id": "acc[0-3]", "designs": ["os16", "ws8"],
                      "memory": {"capacity": "4 GiB", "bandwidth": "25.6 GB/s"}}],
    "hosts": [{"id": "host0", "dram": {"capacity": "64 GiB", "bandwidth": "51.2 GB/s"}}],
    "switches": [{"id": "sw0", "latency": "100 ns"}],
    "links": [
        {"between": ["host0", "sw0"], "bandwidth": "16 GB/s", "latency": "1 us"},
        {"pattern": "star", "hub": "sw0", "nodes": "acc[0-1]", "bandwidth": "10 GB/s"},
        {"pattern": "ring", "nodes": "acc[0-3]", "bandwidth": "25 GB/s", "latency": "500 ns"},
        {"between": ["sw0", "acc2"], "bandwidth": "10 GB/s", "duplex": "half"},
    ],
}


def _write(tmp_path: Path, data: object, name: str = "bad.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _set(path: str, value: object) -> Callable[[dict], None]:
    """A change that sets ``d[k1][k2]... = value`` along a dotted path (ints index lists)."""
    keys = [int(k) if k.isdigit() else k for k in path.split(".")]

    def change(d: dict) -> None:
        node = d
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value

    return change


def _delete(path: str) -> Callable[[dict], None]:
    keys = [int(k) if k.isdigit() else k for k in path.split(".")]

    def change(d: dict) -> None:
        node = d
        for k in keys[:-1]:
            node = node[k]
        del node[keys[-1]]

    return change


def _gpu_without_section(d: dict) -> None:
    d["designs"]["h100"] = {"dataflow": "gpu", "clock": "1.83 GHz", "sram": "50 MiB", "sram_bandwidth": "9 TB/s"}


# (case id, change to BASE, key path of the problem, words the message must contain)
CASES = [
    ("unknown top-level key", _set("colour", "red"), "colour",
     "unknown key; expected one of: name, description, source, designs, cluster, accelerators, hosts, switches, links"),
    ("unknown link key", _set("links.1.speed", "1 GB/s"), "links[1].speed",
     "unknown key; expected one of: between, pattern, nodes, hub"),
    ("unknown design key", _set("designs.os16.rows", 16), "designs.os16.rows",
     "unknown key; expected one of: dataflow, pe_rows, pe_cols, clock"),
    ("unknown energy key", _set("designs.ws8.energy.leak", "1 W"), "designs.ws8.energy.leak",
     "expected one of: mac, sram_byte, dram_byte, static_power"),
    ("missing memory", _delete("accelerators.0.memory"), "accelerators[0].memory", "missing required key"),
    ("missing clock", _delete("designs.os16.clock"), "designs.os16.clock", "missing required key"),
    ("missing link bandwidth", _delete("links.2.bandwidth"), "links[2].bandwidth", "missing required key"),
    ("negative bandwidth", _set("links.3.bandwidth", "-10 GB/s"), "links[3].bandwidth",
     'expected a bandwidth like "400 GB/s" that is positive, got \'-10 GB/s\''),
    ("zero memory capacity", _set("hosts.0.dram.capacity", 0), "hosts[0].dram.capacity",
     'expected a bytes like "96 GiB" that is positive'),
    ("unknown design", _set("accelerators.0.designs", ["os16", "tpu9"]), "accelerators[0].designs[1]",
     "unknown design 'tpu9'; expected one of: os16, ws8"),
    ("link to a missing device", _set("links.0.between", ["host0", "acc9"]), "links[0].between[1]",
     "unknown node 'acc9'; expected an accelerator, host or switch id"),
    ("star hub missing", _set("links.1.hub", "sw7"), "links[1].hub", "unknown node 'sw7'"),
    ("unit that does not parse", _set("designs.os16.clock", "fast"), "designs.os16.clock",
     'expected a frequency like "1 GHz", got \'fast\''),
    ("unknown unit", _set("hosts.0.dram.capacity", "64 GiGa"), "hosts[0].dram.capacity", "unknown unit 'GiGa'"),
    ("frequency where a bandwidth is expected", _set("links.2.bandwidth", "2 GHz"), "links[2].bandwidth",
     'expected a bandwidth like "400 GB/s", got \'2 GHz\' (a frequency)'),
    ("time where a size is expected", _set("designs.os16.sram", "1 us"), "designs.os16.sram",
     'expected a bytes like "96 GiB", got \'1 us\' (a time)'),
    ("disconnected accelerator",
     lambda d: d["accelerators"].append({"id": "acc9", "design": "os16",
                                         "memory": {"capacity": "1 GiB", "bandwidth": "1 GB/s"}}),
     "accelerators[1].id", "accelerator acc9 is not connected by any link to the rest of the system"),
    ("duplicate id", lambda d: d["hosts"].append({"id": "acc0", "dram": {"capacity": "1 GiB", "bandwidth": "1 GB/s"}}),
     "hosts[1].id", "duplicate id 'acc0' (already used at accelerators[0].id)"),
    ("empty id range", _set("accelerators.0.id", "acc[3-1]"), "accelerators[0].id",
     "range 'acc[3-1]' is empty (upper bound below lower bound)"),
    ("malformed id range", _set("switches.0.id", "sw[0-1"), "switches[0].id",
     "expected an id or a range like 'acc[0-15]', got 'sw[0-1'"),
    ("mesh size mismatch", _set("links.2", {"pattern": "mesh", "nodes": "acc[0-3]", "rows": 2, "cols": 3,
                                            "bandwidth": "25 GB/s"}),
     "links[2].pattern", "mesh 2x3 needs 6 nodes, got 4"),
    ("mesh without shape", _set("links.2", {"pattern": "mesh", "nodes": "acc[0-3]", "bandwidth": "25 GB/s"}),
     "links[2]", "pattern 'mesh' needs 'rows' and 'cols'"),
    ("star without hub", _delete("links.1.hub"), "links[1]", "pattern 'star' needs 'hub'"),
    ("unknown pattern", _set("links.2.pattern", "torus"), "links[2].pattern",
     "input should be 'ring', 'chain', 'mesh', 'star' or 'full', got 'torus'"),
    ("link and pattern at once", _set("links.0.pattern", "ring"), "links[0]",
     "give either 'between: [a, b]' or 'pattern:' with 'nodes:'"),
    ("self link", _set("links.3.between", ["acc2", "acc2"]), "links[3]", "a link needs two different endpoints"),
    ("second link between a pair", _set("links.3.between", ["acc0", "acc1"]), "links[3]",
     "second link between acc0 and acc1 (first at links[2])"),
    ("bad duplex", _set("links.3.duplex", "both"), "links[3].duplex", "input should be 'full' or 'half', got 'both'"),
    ("design and designs", _set("accelerators.0.design", "os16"), "accelerators[0]",
     "give exactly one of 'design' (fixed) or 'designs'"),
    ("unknown dataflow", _set("designs.os16.dataflow", "diagonal"), "designs.os16.dataflow",
     "got 'diagonal'"),
    ("pe_rows not a number", _set("designs.os16.pe_rows", "many"), "designs.os16.pe_rows",
     "input should be a valid integer"),
    ("systolic design without an array", _set("designs.os16.pe_rows", 0), "designs.os16",
     "dataflow 'os' needs positive pe_rows and pe_cols"),
    ("gpu design without gpu section", _gpu_without_section, "designs.h100",
     "a design with dataflow 'gpu' needs a 'gpu:' section (sms, peak_flops)"),
    ("gpu design with empty peaks",
     lambda d: d["designs"].update(h100={"dataflow": "gpu", "clock": "1.83 GHz", "sram": "50 MiB",
                                         "sram_bandwidth": "9 TB/s", "gpu": {"sms": 132, "peak_flops": {}}}),
     "designs.h100.gpu.peak_flops", "expected at least one dtype with its peak FLOP/s"),
    ("design name inside the design", _set("designs.os16.name", "other"), "designs.os16.name", "unknown key"),
    ("no links", _set("links", []), "links", "list should have at least 1 item"),
    ("links not a list", _set("links", {"between": ["host0", "sw0"]}), "links", "input should be a valid list"),
]


@pytest.mark.parametrize("change,path,words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_system_file_names_file_key_and_expectation(tmp_path: Path, capsys, change, path: str,
                                                        words: str) -> None:
    data = copy.deepcopy(BASE)
    change(data)
    file = _write(tmp_path, data)
    with pytest.raises(InputError) as info:
        load_system(file)
    err = info.value
    message = str(err)
    assert err.file == str(file)
    assert err.problems == [(path, err.problems[0][1])], f"expected exactly one problem at {path}: {err.problems}"
    assert message.startswith(f"{file}: {path}: "), message
    assert words in message, message

    # the CLI prints the same message and exits with 2
    assert main(["show", str(file)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"{file}: {path}: " in captured.err
    assert "Traceback" not in captured.err


def test_at_least_twelve_bad_input_cases() -> None:
    assert len(CASES) >= 12


def test_yaml_syntax_error_names_line_and_column(tmp_path: Path) -> None:
    file = _write(tmp_path, "name: broken\ndesigns: {os16: {dataflow: os\nlinks: []\n")
    with pytest.raises(InputError) as info:
        load_system(file)
    assert str(info.value).startswith(f"{file}: line ")
    assert "column" in info.value.path
    assert "not valid YAML" in str(info.value)


@pytest.mark.parametrize("text", ["", "- just\n- a list\n", "42\n"])
def test_file_that_is_not_a_mapping(tmp_path: Path, text: str) -> None:
    file = _write(tmp_path, text)
    with pytest.raises(InputError) as info:
        load_system(file)
    assert str(info.value).startswith(f"{file}: expected a mapping with keys name, designs, accelerators")


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    data["links"][0]["bandwidth"] = "fast"
    data["links"][2]["latency"] = "-1 us"
    data["hosts"][0]["dram"]["bandwidth"] = "3 GHz"
    with pytest.raises(InputError) as info:
        load_system(_write(tmp_path, data))
    assert [p for p, _ in info.value.problems] == ["hosts[0].dram.bandwidth", "links[0].bandwidth", "links[2].latency"]


def test_missing_file_and_unknown_name(tmp_path: Path) -> None:
    with pytest.raises(InputError) as info:
        load_system(tmp_path / "nope.yaml")
    assert "no such system file; expected a path or one of the shipped systems: " in str(info.value)
    assert "dgx-h100" in str(info.value)


def test_cli_subprocess_exits_2_without_traceback(tmp_path: Path) -> None:
    data = copy.deepcopy(BASE)
    data["links"][3]["bandwidth"] = "2 GHz"
    file = _write(tmp_path, data)
    proc = subprocess.run([sys.executable, "-m", "marssim", "show", str(file)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (f"marssim show: error: {file}: links[3].bandwidth: expected a bandwidth like "
                                   "\"400 GB/s\", got '2 GHz' (a frequency)")


# ----------------------------------------------------------------------------- good files
def test_base_system_loads_with_expected_structure(tmp_path: Path) -> None:
    system = load_system(_write(tmp_path, BASE, "good.yaml"))
    assert system.accelerator_ids == ("acc0", "acc1", "acc2", "acc3")
    assert len(system.links) == 1 + 2 + 4 + 1
    assert system.designs["ws8"].energy.mac == pytest.approx(1.5e-12)
    assert system.designs["ws8"].clock == 800e6
    assert system.accelerator("acc0").memory.bandwidth == 25.6e9
    assert system.design("acc0", "os16").dram_bandwidth == 25.6e9  # bounded by the accelerator's memory
    assert main(["show", str(tmp_path / "good.yaml")]) == 0


def test_count_template_and_zero_padded_ranges() -> None:
    assert expand_ids("c[00-11]")[:2] == ["c00", "c01"] and expand_ids("c[00-11]")[-1] == "c11"
    assert expand_ids(["a", "b[1-2]x"]) == ["a", "b1x", "b2x"]
    data = copy.deepcopy(BASE)
    data["accelerators"] = [{"id": "acc{i}", "count": 4, "designs": ["os16"],
                             "memory": {"capacity": "1 GiB", "bandwidth": "1 GB/s"}}]
    system = system_from_dict(data, "count.yaml")
    assert system.accelerator_ids == ("acc0", "acc1", "acc2", "acc3")


SHIPPED = {p.stem: p for p in shipped_systems()}


def test_at_least_five_shipped_systems() -> None:
    assert {"mars-adaptive-16", "herald-soc", "dgx-h100", "chiplet-mesh-4x4", "ring-8"} <= set(SHIPPED)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_system_loads_and_is_cited(name: str) -> None:
    path = SHIPPED[name]
    system = load_system(name)
    assert system.name == name and Path(system.path) == path
    assert system.description
    header = path.read_text(encoding="utf-8").split("\nname:")[0]
    assert header.startswith("#") and "Sources" in header, "each shipped file opens with a comment citing its sources"
    for acc in system.accelerators:
        for d in acc.designs:
            assert system.designs[d].peak_macs_per_s > 0
        host = system.nearest_host(acc.id)
        assert system.route(host, acc.id).latency >= 0


def test_mars_system_is_adaptive() -> None:
    system = load_system("mars-adaptive-16")
    assert len(system.accelerators) == 16
    assert all(len(a.designs) >= 3 for a in system.accelerators)
    dataflows = {system.designs[d].dataflow for d in system.accelerators[0].designs}
    assert {"os", "ws", "rs", "nvdla", "shidiannao"} <= dataflows
    assert all(system.designs[d].energy is not None for d in system.designs)
    # boards of 4: inside a board faster than between boards
    assert system.bottleneck_bandwidth("acc0", "acc1") > system.bottleneck_bandwidth("acc0", "acc4")


def test_herald_soc_has_fixed_heterogeneous_designs() -> None:
    system = load_system("herald-soc")
    assert all(a.fixed for a in system.accelerators)
    assert len({system.designs[a.designs[0]].dataflow for a in system.accelerators}) >= 3


def test_dgx_h100_numbers() -> None:
    system = load_system("dgx-h100")
    assert len(system.accelerators) == 8
    h100 = system.designs["h100"]
    assert h100.dataflow == "gpu" and h100.gpu.sms == 132 and h100.gpu.calibration == "H100"
    assert h100.gpu.peak_flops["bf16"] == pytest.approx(989.4e12)
    assert h100.gpu.peak_flops["tf32"] == pytest.approx(494.7e12)
    # 989.4 TFLOP/s = 132 SMs x 4096 FLOP/clock x clock
    assert h100.gpu.peak_flops["fp16"] == pytest.approx(132 * 4096 * h100.clock, rel=1e-3)
    for acc in system.accelerators:
        assert acc.memory.capacity == 80 * 2**30 and acc.memory.bandwidth == 3.35e12
    for i in range(8):
        for j in range(8):
            if i != j:
                assert system.bottleneck_bandwidth(f"gpu{i}", f"gpu{j}") == 450e9
                assert system.route(f"gpu{i}", f"gpu{j}").nodes == (f"gpu{i}", "nvswitch", f"gpu{j}")


def test_ring_8_and_chiplet_mesh_shapes() -> None:
    ring = load_system("ring-8")
    ici = [link for link in ring.links if link.a.startswith("tpu") and link.b.startswith("tpu")]
    assert len(ring.accelerators) == 8 and len(ici) == 8
    assert all(ring.graph.degree(f"tpu{i}") >= 2 for i in range(8))
    mesh = load_system("chiplet-mesh-4x4")
    assert len(mesh.accelerators) == 16
    assert sum(1 for link in mesh.links if link.a.startswith("chip") and link.b.startswith("chip")) == 24
