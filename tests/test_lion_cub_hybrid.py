"""Lion Cub on the hybrid mesh: data 2 × spatial 2 trains as data 2 alone over the options that
matter (every pair of quantizer, collective and momentum-sync schedule; allgather; sync
patterns), resumes with every data rank's momentum, and counts its halo traffic exactly; and
hierarchy node on data 4 as 2 nodes × 2 (parallel.assumed_ranks_per_node) resumes bit for bit,
and with one rank a node is flat bit for bit.

Two torchrun spawns (2 and 4 gloo ranks, tests/spatial_ranks.py mode `train`) run every case in
one process group each. Why the tolerance holds here and what it does not promise over long runs:
docs/explanation/lion_cub_hybrid.md (a fp32-level gradient difference can move one rank's quantized
value
across a rounding boundary and so flip one element's vote; a tiny model for a few steps has none).
"""

from __future__ import annotations

import fnmatch
import functools
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from shard_fixtures import make_random_shards
from test_lion_cub import momenta_per_data_rank
from test_spatial_layers import run_ranks
from test_spatial_train import TINY, epoch_records

from cosmocub.models.cosmoflow import CosmoFlow

pytestmark = pytest.mark.slow

TOLERANCE = 1e-5  # relative, as the issue asks
QUANTIZERS = {"sign": {"quantizer": "sign"}, "l1": {"quantizer": "l1", "bits": 4}}
SCHEDULES = {
    "never": {"schedule": "never"},
    "every": {"schedule": "every", "every_steps": 2},  # steps 2, 4, 6, 8
    "exponential": {"schedule": "exponential", "k": 1.0},  # steps 1, 3, 7
}
# Every pair of (quantizer, collective, schedule) values in 6 runs instead of all 12 triples:
# the schedule acts on the momenta, after and apart from the exchange of quantized values.
PAIRWISE = [
    ("sign", "alltoall", "never"),
    ("sign", "allreduce", "every"),
    ("sign", "alltoall", "exponential"),
    ("l1", "allreduce", "never"),
    ("l1", "alltoall", "every"),
    ("l1", "allreduce", "exponential"),
]
CASES: dict[str, dict[str, Any]] = {
    f"{q} {c} {s}": {**QUANTIZERS[q], "collective": c, "momentum_sync": SCHEDULES[s]}
    for q, c, s in PAIRWISE
}
CASES["sign allgather every"] = {"collective": "allgather", "momentum_sync": SCHEDULES["every"]}
PATTERNS = {"head": ["head.*"], "convs": ["conv_blocks.*.conv.*"]}
for _name, _patterns in PATTERNS.items():
    CASES[f"l1 allreduce every patterns={_name}"] = {
        **QUANTIZERS["l1"],
        "collective": "allreduce",
        "momentum_sync": {**SCHEDULES["every"], "patterns": _patterns},
    }
RESUMED = "l1 alltoall every"  # also run stopped at step 5 and resumed from step 3
STEPS = 8  # 16 samples / (2 data ranks × 2) = 4 steps an epoch, 2 epochs
# Data 4 (local batch 1: 4 steps an epoch, as above), hierarchy node: 2 nodes × 2, or 4 × 1.
NODE = {"parallel": {"assumed_ranks_per_node": 2}, "train": {"local_batch_size": 1}}
NODE_RUNS = {
    "node 2x2": ({"hierarchy": "node"}, NODE),
    "node 2x2 resumed": ({"hierarchy": "node"}, NODE),
    "node 4x1": ({"hierarchy": "node"}, {**NODE, "parallel": {"assumed_ranks_per_node": 1}}),
    "flat 4x1": ({"hierarchy": "flat"}, {**NODE, "parallel": {"assumed_ranks_per_node": 1}}),
    "flat 2x2": ({"hierarchy": "flat"}, NODE),
}
# spatial 4 = [2, 2, 1], data 1: halos along two dims (edges carried by the second exchange)
HALO_2D = {"parallel": {"spatial": 4, "split": [2, 2, 1]}, "train": {"local_batch_size": 4}}


def _config(options: dict[str, Any], **sections: dict[str, Any]) -> dict[str, Any]:
    values = json.loads(json.dumps(TINY))
    values["model"]["batch_norm"] = True  # as the issue ran it
    values["optimizer"].update(name="lion_cub", lr=0.002, lion_cub=options)
    values["train"].update(local_batch_size=2, checkpoint_every_steps=3)
    for section, changes in sections.items():
        values.setdefault(section, {}).update(changes)
    return values


def _spawn(tmp: Path, shards: Path, mesh: str, nproc: int, runs: list[dict]) -> dict[str, Any]:
    for run in runs:
        path = tmp / mesh / f"{run['name'].replace(' ', '_')}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(run.pop("values")))
        run.update(config=str(path), run_dir=str(path.with_suffix("")))
    manifest = tmp / f"{mesh}.json"
    manifest.write_text(json.dumps({"shards": str(shards), "runs": runs}))
    summaries = run_ranks(tmp / f"{mesh}-results.json", nproc, "train", str(manifest), timeout=400)
    return {run["name"]: (Path(run["run_dir"]), summaries[run["name"]]) for run in runs}


@pytest.fixture(scope="module")
def meshes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("hybrid")
    shards = make_random_shards(tmp / "shards", counts={"train": 16, "val": 8}, size=8)
    data = [{"name": n, "values": _config(o)} for n, o in CASES.items()]
    hybrid = [{"name": n, "values": _config(o, parallel={"spatial": 2})} for n, o in CASES.items()]
    hybrid.append(
        {
            "name": f"{RESUMED} resumed",
            "values": _config(CASES[RESUMED], parallel={"spatial": 2}),
            "stop_at": 5,
        }
    )
    hybrid.append({"name": "halo [2, 2, 1]", "values": _config(CASES[RESUMED], **HALO_2D)})
    for name, (options, sections) in NODE_RUNS.items():
        run = {"name": name, "values": _config({**CASES[RESUMED], **options}, **sections)}
        hybrid.append(run | ({"stop_at": 5} if name.endswith("resumed") else {}))
    return {
        "data": _spawn(tmp, shards, "data", 2, data),
        "hybrid": _spawn(tmp, shards, "hybrid", 4, hybrid),
    }


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖₂ / ‖b‖₂ in float64 (0 for two zero tensors)."""
    a, b = a.double(), b.double()
    scale = b.norm().item()
    return (a - b).norm().item() / (scale if scale > 0 else 1.0)


@functools.cache  # read once, asked by several tests
def final_state(run_dir: Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(model state_dict, {parameter name: (data ranks, *shape) momenta}) at the last step."""
    (folder,) = (run_dir / "checkpoints").iterdir()
    payload = torch.load(folder / f"step_{STEPS:08d}.pt", weights_only=True)
    names = [n for n, p in CosmoFlow(load_model_config(run_dir)).named_parameters()]
    per_rank = momenta_per_data_rank(folder / f"step_{STEPS:08d}.pt")
    return payload["model"], {names[i]: m for i, m in per_rank.items()}


def load_model_config(run_dir: Path):
    from cosmocub.config import load_config

    return load_config(run_dir.with_suffix(".yaml")).model


@pytest.mark.parametrize("case", list(CASES))
def test_hybrid_mesh_trains_as_data_alone(meshes: dict[str, dict[str, Any]], case: str) -> None:
    (run_a, summary_a), (run_b, summary_b) = meshes["data"][case], meshes["hybrid"][case]
    assert (summary_a["data_parallel"], summary_a["spatial_parallel"]) == (2, 1)
    assert (summary_b["data_parallel"], summary_b["spatial_parallel"]) == (2, 2)
    assert summary_a["steps"] == summary_b["steps"] == STEPS
    for a, b in zip(epoch_records(run_a), epoch_records(run_b), strict=True):
        for key in ("train_loss", "val_loss", "val_mae"):
            assert b[key] == pytest.approx(a[key], rel=TOLERANCE), (case, a["epoch"], key)
    weights_a, momenta_a = final_state(run_a)
    weights_b, momenta_b = final_state(run_b)
    for name in weights_a:
        if weights_a[name].is_floating_point():
            assert rel(weights_b[name], weights_a[name]) <= TOLERANCE, (case, name)
    # Stronger, and what docs/explanation/lion_cub_hybrid.md promises while no quantized value
    # meets a
    # rounding boundary: every voted update was the same, so the parameters are bit for bit.
    for name in momenta_a:
        assert torch.equal(weights_b[name], weights_a[name]), (case, name)
    # Every data rank's momentum, as the checkpoint keeps them: the same on both meshes.
    for name in momenta_a:
        assert momenta_b[name].shape[0] == 2
        assert rel(momenta_b[name], momenta_a[name]) <= TOLERANCE, (case, name)
    torch.manual_seed(0)  # the config's seed: training moved the weights
    initial = CosmoFlow(load_model_config(run_a)).state_dict()
    assert rel(weights_a["head.output.weight"], initial["head.output.weight"]) > 1e-3


@pytest.mark.parametrize("case", list(CASES))
def test_momentum_sync_averages_over_the_data_ranks(
    meshes: dict[str, dict[str, Any]], case: str
) -> None:
    # Step 8 is a sync step of `every` (2, 4, 6, 8), not of `exponential` (1, 3, 7): there the
    # data ranks' momenta of the synced parameters are one average, the others their own.
    sync = CASES[case]["momentum_sync"]
    patterns = sync.get("patterns", ["*"])
    for mesh in ("data", "hybrid"):
        _, momenta = final_state(meshes[mesh][case][0])
        for name, per_rank in momenta.items():
            synced = sync["schedule"] == "every" and any(
                fnmatch.fnmatchcase(name, p) for p in patterns
            )
            assert torch.equal(per_rank[0], per_rank[1]) == synced, (mesh, case, name)


def test_hybrid_resume_keeps_every_data_ranks_momentum(meshes: dict[str, dict[str, Any]]) -> None:
    run, summary = meshes["hybrid"][f"{RESUMED} resumed"]
    whole, _ = meshes["hybrid"][RESUMED]
    assert summary["resumed_from"].endswith("step_00000003.pt") and summary["steps"] == STEPS
    weights, momenta = final_state(run)
    weights_whole, momenta_whole = final_state(whole)
    for name in weights_whole:
        assert torch.equal(weights[name], weights_whole[name]), name
    for name in momenta_whole:
        assert torch.equal(momenta[name], momenta_whole[name]), name
    assert epoch_records(run) == epoch_records(whole)
    # And the resumed hybrid run's per-rank momenta are data-alone's.
    _, momenta_data = final_state(meshes["data"][RESUMED][0])
    for name in momenta_data:
        assert rel(momenta[name], momenta_data[name]) <= TOLERANCE, name


def predicted_halo_bytes(values: dict[str, Any], split: list[int], coords=(0, 0, 0)) -> int:
    """What the rank at `coords` sends per training step by the geometry alone: per conv layer
    and split dim, one face (batch × in-channels × halo width × the other two local extents,
    those of earlier split dims already padded by their halos) per neighbour, fp32, in forward,
    and the same face's gradient back in backward — except for the first conv, whose input (the
    data) needs no gradient."""
    model, batch = values["model"], values["train"]["local_batch_size"]
    halo = 3 // 2  # kernel 3
    extent, channels, total = model["input_size"], 4, 0
    for block in range(model["num_conv_blocks"]):
        local = [extent // s for s in split]
        for d in range(3):
            if split[d] == 1:
                continue
            neighbours = (coords[d] > 0) + (coords[d] < split[d] - 1)
            face = batch * channels * halo * math.prod(n for k, n in enumerate(local) if k != d)
            total += (1 if block == 0 else 2) * neighbours * face * 4
            local[d] += 2 * halo
        channels, extent = model["base_filters"] * 2**block, extent // 2
    return total


def test_halo_bytes_are_the_geometry(meshes: dict[str, dict[str, Any]]) -> None:
    values = _config(CASES[RESUMED], parallel={"spatial": 2})
    expected_d = predicted_halo_bytes(values, [2, 1, 1])
    # By hand for split [2, 1, 1], batch 2: block 0 sends 2·4·1·8·8 floats forward, block 1
    # 2·4·1·4·4 forward and back (4 channels from block 0, 4³ after the pool).
    assert expected_d == 4 * (2 * 4 * 8 * 8 + 2 * (2 * 4 * 4 * 4))
    for case in CASES:
        final = meshes["hybrid"][case][1]["final"]
        assert final["halo_bytes_per_step"] == expected_d, case
        assert final["time_halo_s"] > 0, case
        assert meshes["data"][case][1]["final"]["halo_bytes_per_step"] == 0, case
        assert meshes["data"][case][1]["final"]["time_halo_s"] == 0, case
    # Two split dims: the H faces carry the D halos (edges), rank 0 has one neighbour in each.
    values_2d = _config(CASES[RESUMED], **HALO_2D)
    final_2d = meshes["hybrid"]["halo [2, 2, 1]"][1]["final"]
    expected_2d = predicted_halo_bytes(values_2d, [2, 2, 1])
    assert expected_2d == 4 * 4 * 4 * ((4 * 8 + 6 * 8) + 2 * (2 * 4 + 4 * 4))
    assert final_2d["halo_bytes_per_step"] == expected_2d
    # The step's split adds up: compute is what the measured exchanges leave of the step.
    parts = ("time_compute_s", "time_exchange_s", "time_momentum_sync_s", "time_halo_s")
    assert all(final_2d[k] >= 0 for k in parts) and final_2d["time_compute_s"] > 0


def test_hierarchy_node_resumes_bit_for_bit_and_is_flat_with_one_rank_a_node(
    meshes: dict[str, dict[str, Any]],
) -> None:
    runs = {name: meshes["hybrid"][name] for name in NODE_RUNS}
    (whole, summary), (resumed, summary_resumed) = runs["node 2x2"], runs["node 2x2 resumed"]
    assert (summary["data_parallel"], summary["steps"]) == (4, STEPS)
    assert summary_resumed["resumed_from"].endswith("step_00000003.pt")
    weights, momenta = final_state(resumed)
    weights_whole, momenta_whole = final_state(whole)
    for name in weights_whole:
        assert torch.equal(weights[name], weights_whole[name]), name
    for name in momenta_whole:
        assert momenta[name].shape[0] == 4
        assert torch.equal(momenta[name], momenta_whole[name]), name
    assert epoch_records(resumed) == epoch_records(whole)
    # One rank a node: node is flat, bit for bit (weights, every rank's momentum, the losses).
    node, flat = final_state(runs["node 4x1"][0]), final_state(runs["flat 4x1"][0])
    for a, b in zip(node, flat, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in b)
    assert epoch_records(runs["node 4x1"][0]) == epoch_records(runs["flat 4x1"][0])
    # Two a node: what crosses nodes shrinks (the all-to-all's chunks 1/2 as often); the step 8
    # sync averaged every data rank's momentum in two levels.
    inter = {
        name: json.loads((runs[name][0] / "metrics.jsonl").read_text().splitlines()[-1])[
            "comm_bytes_inter_per_step"
        ]
        for name in ("node 2x2", "flat 2x2")
    }
    assert 0 < inter["node 2x2"] < 0.8 * inter["flat 2x2"], inter
    assert all(torch.equal(m[0], m[3]) for m in momenta_whole.values())
