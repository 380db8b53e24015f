"""One measured run to the study's other points, on this machine: trains the config's model on
one rank at each local batch size of a small study (real training, random shards of the
model's input), calibrates the model from ONE point's run folder (`perf-model calibrate
--from-run`: its measured compute ÷ this CPU's calibration at that point) and predicts the
others' compute with it, beside the uncalibrated model. The held-out bounds the model is held
to (docs/explanation/network_scaling_studies.md, "The performance model on a 2 × 1 network study"):
7 % median, 11 % worst.

    nice -n 19 python benchmarks/from_run_study.py [--config config/config.yaml]
        [--batches 2 4 8 16] [--calibrate-on 4] [--rounds 3] [--epochs 4] [--steps 8]
        [--calibration CAL.json] [--keep DIR]

--calibration: this CPU's compute calibration (`perf-model calibrate`), measured now and kept
there where the file does not exist. One rank of one thread a point; the first epoch of each
run is left out (warm-up), as calibrate --from-run leaves it out.

--rounds: every point is trained once a round, the rounds one after the other, and each point
keeps its least disturbed run: of its runs the studies' rule does not mark contended, the
lowest compute as --from-run reads a run on this CPU (its fastest epoch after the first), as
the calibration keeps each timing's fastest repeat. Why: this VM's own speed drifts by up to a
quarter over tens of seconds with nothing else running and its thread on a core (a fixed
matmul timed for 90 s at load 0.6-0.9: 74 to 93 ms by 10-s windows;
docs/explanation/cluster_model.md),
so a single run of a point measures when it ran. Each point's conditions (its ready share: the
time its thread ran over the time it was ready to) are printed beside it, and a point the
studies' own rule marks contended (studies.contended_ready_share, _steal_share) is left out of
the held-out figures, as `perf-model validate` leaves it out. Prints the load before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

from cosmocub.config import load_config
from cosmocub.contention.marks import point_conditions, why_contended
from cosmocub.io import read_jsonl
from cosmocub.perfmodel.cost_model.machines import this_cpu
from cosmocub.perfmodel.measure.calibration_cache import load_or_calibrate
from cosmocub.perfmodel.uses.run_calibration import RunCalibration
from cosmocub.perfmodel.uses.run_folder import calibrate_from_run
from cosmocub.train.main import train

# Random shards in the documented layout: the tests' fixture (tests/shard_fixtures.py), not the
# package's business.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from shard_fixtures import make_random_shards

# median, worst: the model's held-out bounds (docs/explanation/network_scaling_studies.md)
HELD_OUT = (0.07, 0.11)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


class PointRun(NamedTuple):
    """One round's run of a point: the studies' contention mark (empty: none), what --from-run
    reads of it, and its machine conditions."""

    why_contended: str
    calibration: RunCalibration
    conditions: dict[str, float]


def _conditions(run: Path) -> dict[str, float]:
    """The run's machine conditions over its epochs (contention.marks.point_conditions)."""
    return point_conditions([r for r in read_jsonl(run / "metrics.jsonl") if "time_compute_s" in r])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="config/config.yaml")
    parser.add_argument("--batches", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--calibrate-on", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--calibration", type=Path, default=None)
    parser.add_argument("--keep", type=Path, default=None, help="keep the runs in this folder")
    args = parser.parse_args()
    if args.calibrate_on not in args.batches:
        print(f"--calibrate-on {args.calibrate_on}: not one of --batches", file=sys.stderr)
        return 2
    cores = len(os.sched_getaffinity(0))
    print(f"load before: {_load()}; {cores} cores")
    work = Path(tempfile.mkdtemp(prefix="from_run_study_")) if args.keep is None else args.keep
    # Every point runs one thread: the calibration times one (2 threads on a shared 2-core
    # machine measure the other engineers' load).
    one_thread = {"perf_model": {"calibration": {"threads": [1]}}}
    base = load_config(args.config, overrides=one_thread)
    cal_path = args.calibration or work / "calibration.json"
    calibration = load_or_calibrate(cal_path, base.perf_model.calibration, cores=cores)
    print(f"compute calibration: {cal_path} (load now {_load()})")
    shards = make_random_shards(
        work / "shards",
        counts={"train": max(args.batches) * args.steps, "val": max(args.batches)},
        size=base.model.input_size,
        channels=base.model.in_channels,
    )
    configs = {
        batch: load_config(
            args.config,
            overrides={
                "train": {
                    "local_batch_size": batch,
                    "threads_per_rank": 1,
                    "epochs": args.epochs,
                    "max_steps_per_epoch": args.steps,
                    "checkpoint_every_steps": 10_000,
                },
                "tracking": {"enabled": False},
                **one_thread,
            },
        )
        for batch in args.batches
    }
    rounds: dict[int, list[PointRun]] = {batch: [] for batch in args.batches}
    for round_ in range(args.rounds):
        for batch in args.batches:
            run = work / f"round{round_}" / f"batch{batch}"
            train(configs[batch], shards_dir=shards, run_dir=run)
            seen = _conditions(run)
            rounds[batch].append(
                PointRun(
                    why_contended=why_contended(seen, configs[batch].studies),
                    calibration=calibrate_from_run(
                        run, configs[batch], cpu=lambda: (calibration, cores)
                    ),
                    conditions=seen,
                )
            )
        print(f"round {round_} trained (load {_load()})")
    # The least disturbed run: an uncontended one where there is one, then the fastest.
    runs = {
        batch: min(rounds[batch], key=lambda r: (bool(r.why_contended), r.calibration.step_s))
        for batch in args.batches
    }
    point = args.calibrate_on
    cal = runs[point].calibration
    device = this_cpu(threads_per_rank=1, ranks_per_node=1, cores=cores, calibration=calibration)
    print(f"\ncalibrated on batch {point}: layer_scale {cal.layer_scale:.3f}")
    print(
        "batch  measured compute ms  model ms (uncalibrated)  calibrated ms  error    "
        "ready share  load (study's contention mark)  every round's ms"
    )
    errors = []
    for batch in args.batches:
        cfg = configs[batch]
        chosen = runs[batch]
        measured, seen, why = chosen.calibration.step_s, chosen.conditions, chosen.why_contended
        layers = device.layer_seconds(cfg.model, batch=batch, split=(1, 1, 1))
        priced = sum(layers.values()) + device.optimizer_seconds(cfg.model, cfg.optimizer)
        predicted = cal.layer_scale * priced
        error = predicted / measured - 1
        mark = "(calibrated here)" if batch == point else ""
        if batch != point and not why:
            errors.append(abs(error))
        print(
            f"{batch:5d}  {1e3 * measured:19.1f}  {1e3 * priced:23.1f}  {1e3 * predicted:13.1f}"
            f"  {100 * error:+6.1f} %  {seen.get('ready_share', float('nan')):11.2f}  "
            f"{seen.get('load_1m', float('nan')):.2f} {why or 'not contended'} {mark}  "
            + " ".join(f"{1e3 * r.calibration.step_s:.1f}" for r in rounds[batch])
        )
    if not errors:
        print("no held-out point left (all contended): run it on a quieter machine")
        return 1
    median, worst = statistics.median(errors), max(errors)
    within = median <= HELD_OUT[0] and worst <= HELD_OUT[1]
    print(
        f"held out ({len(errors)} points): median |error| {100 * median:.1f} %, worst "
        f"{100 * worst:.1f} % (bounds {100 * HELD_OUT[0]:.0f} % / {100 * HELD_OUT[1]:.0f} %: "
        f"{'within' if within else 'NOT within'})"
    )
    print(f"load after: {_load()}; runs in {work}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
