"""benchmarks/against_mlperf.py on synthetic result trees: its table and its errors, a tree
with no row to predict (one line a system), the strict table's refit without the judged row and
its partner, and the uncalibrated spread it writes for predict."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
from test_cluster_scale import ROOT, _mllog, _tree

from cosmocub.perfmodel.uses.time_to_train import MLPERF_COSMOFLOW


def _against(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """benchmarks/against_mlperf.py's main in this process (its own imports are the package's)."""
    spec = importlib.util.spec_from_file_location(
        "against_mlperf", ROOT / "benchmarks" / "against_mlperf.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "against_mlperf", module)  # its dataclasses look it up
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", ["against_mlperf.py", *args])
    rc = module.main()
    out, err = capsys.readouterr()
    return rc, out, err


def test_against_mlperf_smoke_and_its_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The benchmark on a small synthetic tree: Eos at 32 and 512 GPUs (a scale pair), and a
    system whose accelerator has no preset (a row note); then each bad folder in one line."""
    _tree(tmp_path, "eos_n4_test", nodes=4, gpus_per_node=8, step_s=4.48e-3, eval_s=5.7)
    _tree(tmp_path, "eos_n64_test", nodes=64, gpus_per_node=8, step_s=5.0e-3, eval_s=0.38)
    log = _tree(tmp_path, "gaudi_n4", nodes=4, gpus_per_node=8, step_s=6e-3, eval_s=1.0)
    desc = log.parents[4] / "systems" / "gaudi_n4.json"
    desc.write_text(json.dumps({"accelerator_model_name": "Gaudi 2", "accelerators_per_node": "8"}))
    # v3.0 keeps the other benchmarks' logs beside CosmoFlow's: OpenCatalyst's 42.7 ms step on
    # the same system, as a fetched repository has it, is not a CosmoFlow run (it once was one,
    # and its calibration failed the whole table).
    _tree(tmp_path, "eos_n64_test", "oc20", nodes=8, gpus_per_node=8, step_s=42.7e-3, eval_s=9)
    rc, out, err = _against(monkeypatch, capsys, str(tmp_path))
    assert rc == 0, err
    assert "oc20" not in out and "(device x1." in out
    assert "accelerator 'Gaudi 2' of system 'gaudi_n4' has no cluster preset" in out
    assert "eos_n4_test 32->512" in out and "no other pair" in out
    assert "same system: v3.0 eos_n64_test" in out
    empty = tmp_path / "empty"
    empty.mkdir()
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "result_0.txt").write_text(log.read_text())
    for folder, message in (
        (tmp_path / "missing", "no such folder"),
        (empty, "no result_*.txt below it"),
        (flat, "none under <submitter>/results/"),
    ):
        rc, _, err = _against(monkeypatch, capsys, str(folder))
        assert rc == 2
        assert message in err and len(err.strip().splitlines()) == 1


def test_against_mlperf_notes_a_partner_that_cannot_calibrate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A partner whose step is shorter than the model's own exchange and host work leaves the
    layers nothing: the row that would calibrate from it says so, the other row still predicts."""
    _tree(tmp_path, "eos_n4_test", nodes=4, gpus_per_node=8, step_s=4.48e-3, eval_s=5.7)
    _tree(tmp_path, "eos_n64_fast", nodes=64, gpus_per_node=8, step_s=0.2e-3, eval_s=0.38)
    rc, out, err = _against(monkeypatch, capsys, str(tmp_path))
    assert rc == 0, err
    calibrated = out[out.index("Calibrated, leave one out") :]
    assert "v3.0 eos_n64_fast (strong) cannot calibrate: a measured step of 0.21 ms" in calibrated
    assert "same system: v3.0 eos_n4_test (strong) (device x1." in calibrated


CPU_RUN = {"nodes": 512, "gpus_per_node": 1, "step_s": 0.1, "eval_s": 10.0}
GPU_RUN = {"nodes": 16, "gpus_per_node": 4, "step_s": 0.05, "eval_s": 10.0}
EOS = {
    "accelerator_model_name": "NVIDIA H100 80GB HBM3",
    "accelerators_per_node": "8",
    "framework": "PyTorch NVIDIA Release 23.09",
}


def _system(root: Path, round_: str, submitter: str, system: str, desc: dict, **kw) -> None:
    """A system's folder as the results repositories lay it out, with its systems file."""
    folder = root / round_ / submitter / "results" / system / "strong" / "cosmoflow"
    _mllog(folder / "result_0.txt", **kw)
    systems = root / round_ / submitter / "systems"
    systems.mkdir(parents=True, exist_ok=True)
    (systems / f"{system}.json").write_text(json.dumps(desc))


def test_a_fugaku_only_tree_names_the_cpu_of_each_system(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    desc = {
        "accelerators_per_node": "0",
        "accelerator_model_name": "N/A",
        "host_processor_model_name": "FUJITSU Processor A64FX",
    }
    for system in ("fugaku_512xA64FX_tensorflow_closed", "fugaku_512xA64FX_tensorflow_open"):
        _system(tmp_path, "v1.0", "Fujitsu+RIKEN", system, desc, **CPU_RUN)
    rc, out, err = _against(monkeypatch, capsys, str(tmp_path))
    assert rc == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 3  # the folder's line, then one a system
    assert all("CPU system: A64FX" in line for line in lines[1:])
    assert "fugaku_512xA64FX_tensorflow_closed" in lines[1]
    assert "fugaku_512xA64FX_tensorflow_open" in lines[2]


def test_a_frontera_only_tree_names_its_accelerator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    desc = {"accelerators_per_node": "4", "accelerator_model_name": "NVIDIA Quadro RTX 5000"}
    _system(tmp_path, "v0.7", "TACC", "frontera_rtx_n16", desc, **GPU_RUN)
    rc, out, err = _against(monkeypatch, capsys, str(tmp_path))
    assert rc == 1 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 2
    assert "frontera_rtx_n16" in lines[1] and "'NVIDIA Quadro RTX 5000'" in lines[1]
    assert "no cluster preset" in lines[1]


def _strict_cells(out: str, system: str) -> tuple[float, str]:
    """(cv, drives) of a row's strict constants in the calibrated table."""
    table = out[out.index("Calibrated, leave one out") :]
    line = next(line for line in table.splitlines() if f" {system} " in line)
    found = re.search(r"cv (\d\.\d+), drives (\S+), reader", line)
    assert found, line
    return float(found.group(1)), found.group(2).rstrip(",")


def test_the_strict_table_refits_without_the_row_and_its_partner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two H100 systems at 32 and 512 GPUs: each 4-node instance's staged share outgrows its
    nodes' memory, so each is a drive row. Judged with its partner (its own system's other
    scale), a system's rows take the cv the other system's pair fits and the drives' rate the
    other system's weak evaluations read: 16,384 samples of 16.8 MB a node over 5.0 s (55.0
    GB/s) for A's rows, over 5.76 s (47.7 GB/s) for the other's."""
    _tree(tmp_path, "eos_n4_a", nodes=4, gpus_per_node=8, step_s=4.48e-3, eval_s=5.76)
    _tree(tmp_path, "eos_n64_a", nodes=64, gpus_per_node=8, step_s=5.0e-3, eval_s=0.38)
    other = {**EOS, "submitter": "Other"}
    for system, nodes, step_s, eval_s in (
        ("eos_n4_other", 4, 4.6e-3, 5.0),
        ("eos_n64_other", 64, 5.3e-3, 0.4),
    ):
        run = {"nodes": nodes, "gpus_per_node": 8, "step_s": step_s, "eval_s": eval_s}
        _system(tmp_path, "v3.0", "Other", system, other, **run)
    rc, out, err = _against(monkeypatch, capsys, str(tmp_path))
    assert rc == 0, err
    node_bytes = 65_536 / 4 * MLPERF_COSMOFLOW.sample_bytes
    for system, drives_s in (("eos_n4_a", 5.0), ("eos_n64_a", 5.0), ("eos_n4_other", 5.76)):
        _, drives = _strict_cells(out, system)
        assert float(drives) == pytest.approx(node_bytes / drives_s / 1e9, rel=2e-3)
    # Each pair's leave-one-out cv is fitted on the other pair alone, as each strict row's is.
    pairs = {line.split()[0]: line for line in out.splitlines() if "->" in line}
    from_a = float(pairs["eos_n4_other"].split()[6])  # the other's pair fitted on A's alone
    from_other = float(pairs["eos_n4_a"].split()[6])
    assert _strict_cells(out, "eos_n64_a")[0] == pytest.approx(from_other, abs=1e-3)
    assert _strict_cells(out, "eos_n64_other")[0] == pytest.approx(from_a, abs=1e-3)
    assert from_a != pytest.approx(from_other, abs=1e-3)  # the two pairs fit different spreads
    assert "PyTorch rows (calibrated, strict): train: median |error|" in out
    assert "PyTorch rows (calibrated, as today): train: median |error|" in out
    assert "MXNet rows' evaluation (calibrated, strict): none" in out
    assert "read from the evaluations of v3.0 eos_n4_a (strong), v3.0 eos_n4_other (strong)" in out


V100_TF = {"accelerator_model_name": "NVIDIA Tesla V100", "framework": "TensorFlow 1.15.0"}
LONGHORN_STEP_S = 84.65e-3  # v1.0 TACC longhorn-tf: 32 nodes x 4 V100, TensorFlow


def test_the_v100_tensorflow_spread_without_longhorn_holds_longhorns_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A table of v0.7's other V100 TensorFlow runs (their published steps: HAL 16 x 4 at
    61.5 ms, Cori GPU 8 x 8 at 82.6 ms, ABCI 128 x 4 at 37.3 ms), no Longhorn: the range of
    published ÷ predicted it writes, times predict's uncalibrated step for Longhorn's shape,
    holds Longhorn's published 84.65 ms; predict prints it and the command that narrows it."""
    from cosmocub.cli import main
    from cosmocub.perfmodel.uses import uncalibrated_spread

    for system, submitter, nodes, per_node, step_s in (
        ("halv100_n16_tf", "NCSA", 16, 4, 61.5e-3),
        ("corigpu_n64", "LBNL", 8, 8, 82.6e-3),
        ("abci_512xV100", "Fujitsu", 128, 4, 37.3e-3),
    ):
        desc = {**V100_TF, "accelerators_per_node": str(per_node), "submitter": submitter}
        run = {"nodes": nodes, "gpus_per_node": per_node, "step_s": step_s, "eval_s": 30.0}
        _system(tmp_path / "logs", "v0.7", submitter, system, desc, **run)
    spread = tmp_path / "spread.json"
    rc, out, err = _against(
        monkeypatch, capsys, str(tmp_path / "logs"), "--write-spread", str(spread)
    )
    assert rc == 0, err
    table = json.loads(spread.read_text())
    v100 = table["families"]["V100 tensorflow"]
    assert len(v100["rows"]) == 3 and table["date"] and "against_mlperf.py" in table["source"]
    # The range's ends are the table's own rows: each one's step ratio as the package's constants
    # give it (the bracket; 2 digits printed), inverted.
    uncalibrated = out[: out.index("Calibrated, leave one out")]
    steps = [
        re.search(r"\) \[([\d.]+)x\]", line)
        for line in uncalibrated.splitlines()
        if line.startswith("v0.7 ")
    ]
    found = sorted(1 / float(m.group(1)) for m in steps if m)
    assert len(found) == 3
    assert v100["step"] == pytest.approx([found[0], found[-1]], rel=0.03)
    monkeypatch.setattr(uncalibrated_spread, "SPREAD_FILE", spread)
    config = str(Path(__file__).resolve().parents[1] / "config" / "cosmoflow-mlperf.yaml")
    flags = ["perf-model", "predict", "--config", config, "--accelerator", "v100", "--nodes", "32"]
    flags += ["--ranks-per-node", "4", "--rate-mbit", "100000", "--train-samples", "524288"]
    flags += ["--override", "{train: {local_batch_size: 1}}"]
    assert main([*flags, "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)["predictions"][0]
    low, high = answer["step_s_range"]
    assert low == pytest.approx(answer["full_step_s"] * v100["step"][0], rel=1e-9)
    assert high == pytest.approx(answer["full_step_s"] * v100["step"][1], rel=1e-9)
    assert low < LONGHORN_STEP_S < high
    epoch = answer["training_epoch_s_range"]
    assert epoch[1] == pytest.approx(answer["training_epoch_s"] * v100["training_epoch"][1])
    assert main(flags) == 0
    text = capsys.readouterr().out
    assert f"{1e3 * low:.3g}-{1e3 * high:.3g} ms" in text
    assert "calibrate --from-run" in text
