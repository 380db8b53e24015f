"""`cosmocub perf-model bench | bench-ranks | fit | validate | extrapolate`: the step-time
performance model (its stages are cosmocub.perfmodel.stage's).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cosmocub.cli.common import add_config
from cosmocub.config import load_config


def _cmd_bench(args: argparse.Namespace) -> int:
    from cosmocub.perfmodel.stage import bench

    bench(args.config, Path(args.out))
    return 0


def _cmd_bench_ranks(args: argparse.Namespace) -> int:
    from cosmocub.perfmodel.stage import bench_ranks

    bench_ranks(
        args.config,
        link=args.link,
        out=Path(args.out),
        sizes_bytes=args.sizes,
        repeats=args.repeats,
    )
    return 0


def _cmd_fit(args: argparse.Namespace) -> int:
    from cosmocub.perfmodel.stage import fit

    fit(Path(args.samples), Path(args.out))
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from cosmocub.perfmodel.stage import validate

    validate(
        load_config(args.config),
        points=[Path(p) for p in args.points],
        fit_path=Path(args.fit),
        tsv=Path(args.tsv),
        plot=Path(args.plot),
        calibrate_on=args.calibrate_on,
    )
    return 0


def _cmd_extrapolate(args: argparse.Namespace) -> int:
    from cosmocub.perfmodel.stage import extrapolate

    extrapolate(load_config(args.config), model_config=args.model_config, out=Path(args.out))
    return 0


def add_perf_model(sub) -> None:
    p = sub.add_parser("perf-model", help="the step-time performance model (α–β + compute)")
    cmds = p.add_subparsers(dest="perf_command", required=True)
    b = cmds.add_parser(
        "bench",
        help="time collectives on loopback and, as root, on the emulated link at every study rate",
    )
    b.set_defaults(handler=_cmd_bench)
    b.add_argument(
        "--out", required=True, help="samples TSV (link, kind, group_size, nbytes, seconds)"
    )
    add_config(b)
    r = cmds.add_parser(
        "bench-ranks",
        help="time collectives on one link, in the ranks a launcher started "
        "(`cosmocub launch … -- perf-model bench-ranks`)",
    )
    r.set_defaults(handler=_cmd_bench_ranks)
    r.add_argument("--link", required=True, help="the link's name in the samples (e.g. loopback)")
    r.add_argument("--out", required=True, help="samples TSV, written by rank 0")
    r.add_argument("--sizes", type=int, nargs="+", help="default: perf_model.bench.sizes_bytes")
    r.add_argument("--repeats", type=int, help="default: perf_model.bench.repeats")
    add_config(r)
    f = cmds.add_parser("fit", help="α–β per link and collective kind from the samples")
    f.set_defaults(handler=_cmd_fit)
    f.add_argument("--samples", required=True)
    f.add_argument("--out", required=True)
    v = cmds.add_parser("validate", help="measured (a study's points.tsv) against predicted")
    v.set_defaults(handler=_cmd_validate)
    v.add_argument(
        "--points",
        required=True,
        nargs="+",
        help="points.tsv files, the first holding the calibration point; configs beside them",
    )
    v.add_argument("--fit", required=True, help="the α–β fit (perf-model fit)")
    v.add_argument("--tsv", required=True)
    v.add_argument("--plot", required=True)
    v.add_argument(
        "--calibrate-on",
        help="a one-rank point whose measured compute sets this machine's speed (left out of "
        "the errors); default: perf_model.calibrate_on",
    )
    add_config(v)
    e = cmds.add_parser("extrapolate", help="step time on GPU clusters, with its assumptions")
    e.set_defaults(handler=_cmd_extrapolate)
    e.add_argument("--model-config", required=True, help="config whose model is extrapolated")
    e.add_argument("--out", required=True, help="folder for the TSVs, plot and assumptions")
    add_config(e)
