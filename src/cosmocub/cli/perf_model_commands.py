"""`cosmocub perf-model bench | bench-ranks | fit | calibrate | validate | predict |
extrapolate`: the step-time performance model (the stages' work is in
cosmocub.perfmodel.uses.entry_points; predict's in cosmocub.perfmodel.uses.predict_stage).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cosmocub.cli.common import add_config
from cosmocub.config import deep_merge, load_config

CALIBRATION_HELP = (
    "this CPU's compute calibration (JSON; measured and written where there is none; default: "
    "perf_model.calibration.path, else {results}/perf_model/calibration.json)"
)


def _cmd_bench(args: argparse.Namespace) -> int:
    from cosmocub.perfmodel.uses.entry_points import bench

    bench(args.config, Path(args.out))
    return 0


def _cmd_bench_ranks(args: argparse.Namespace) -> int:
    from cosmocub.perfmodel.uses.entry_points import bench_ranks

    bench_ranks(
        args.config,
        link=args.link,
        out=Path(args.out),
        sizes_bytes=args.sizes,
        repeats=args.repeats,
    )
    return 0


def _cmd_fit(args: argparse.Namespace) -> int:
    from cosmocub.perfmodel.uses.entry_points import fit

    fit(Path(args.samples), Path(args.out))
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from cosmocub.perfmodel.uses.entry_points import validate

    validate(
        load_config(args.config),
        points=[Path(p) for p in args.points],
        fit_path=Path(args.fit),
        tsv=Path(args.tsv),
        plot=Path(args.plot),
        calibration=None if args.calibration is None else Path(args.calibration),
        fit_set=args.fit_set,
    )
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    if args.from_run is not None:
        from cosmocub.perfmodel.uses.entry_points import this_cpu_calibration
        from cosmocub.perfmodel.uses.run_folder import calibrate_from_run

        if args.out is None:
            raise ValueError("--from-run: needs --out FILE (the run calibration to write)")
        cfg = load_config(args.config)
        cal = calibrate_from_run(Path(args.from_run), cfg, cpu=lambda: this_cpu_calibration(cfg))
        cal.write(Path(args.out))
        print(
            f"{args.out}: {cal.preset} ({cal.software or 'no software profile'}), "
            f"{cal.nodes} x {cal.ranks_per_node} GPUs, step {1e3 * cal.step_s:.3g} ms: layers "
            f"x {cal.layer_scale:.3f} the model's, evaluation step x {cal.eval_scale:.3f}"
        )
        return 0
    if args.device == "cuda":
        from cosmocub.perfmodel.measure.gpu_layers import calibrate_cuda

        cfg = load_config(args.config)
        out = Path(args.out or f"{cfg.results}/perf_model/gpu_layers.json")
        times = calibrate_cuda(cfg.model, batch=args.batch, out=out)
        print(f"{out}: {times.device}, batch {times.batch}, {times.dtype}")
        return 0
    from cosmocub.perfmodel.uses.entry_points import calibrate

    calibrate(load_config(args.config), out=None if args.out is None else Path(args.out))
    return 0


def _mesh(text: str) -> tuple[int, int]:
    """--mesh DATAxSPATIAL, e.g. 512x4."""
    data, sep, spatial = text.lower().partition("x")
    if not (sep and data.isdigit() and spatial.isdigit() and int(data) and int(spatial)):
        raise argparse.ArgumentTypeError(f"{text!r} is not DATAxSPATIAL (e.g. 512x4)")
    return int(data), int(spatial)


def _split(text: str) -> tuple[int, int, int]:
    """--split D,H,W, e.g. 2,2,1."""
    parts = text.split(",")
    if len(parts) != 3 or not all(p.isdigit() and int(p) for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not D,H,W (e.g. 2,2,1)")
    return int(parts[0]), int(parts[1]), int(parts[2])


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return int(text)


def _yaml_mapping(text: str) -> dict:
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(
            f"--override {text!r}: not valid YAML ({err})".replace("\n", " ")
        ) from None
    if not isinstance(value, dict):
        raise ValueError(f"--override {text!r}: a mapping of config sections, e.g. {OVERRIDE_EG}")
    return value


OVERRIDE_EG = "'{optimizer: {name: lion_cub, lion_cub: {hierarchy: node}}}'"


def _cmd_predict(args: argparse.Namespace) -> int:
    from cosmocub.perfmodel.uses.cluster_stage import print_cluster_prediction
    from cosmocub.perfmodel.uses.predict_flags import MeshFlags, PricingFlags
    from cosmocub.perfmodel.uses.predict_stage import print_prediction

    data, spatial = args.data, args.spatial
    if args.mesh is not None:
        if data is not None or spatial is not None:
            raise ValueError(f"--mesh {args.mesh[0]}x{args.mesh[1]}: give it or --data/--spatial")
        data, spatial = args.mesh
    overrides: dict = {}
    for text in args.override or ():
        overrides = deep_merge(overrides, _yaml_mapping(text))
    cfg = load_config(args.config, overrides=overrides or None)
    flags = MeshFlags(
        data=data,
        spatial=spatial,
        split=args.split,
        nodes=args.nodes,
        ranks_per_node=args.ranks_per_node,
    )
    pricing = PricingFlags(
        epochs=args.epochs,
        train_samples=args.train_samples,
        gpu_calibration=None if args.gpu_calibration is None else Path(args.gpu_calibration),
        as_json=args.json,
        accept_calibration=args.accept_calibration,
        software=args.software,
    )
    if args.cluster is not None:
        for flag, value in (
            ("--accelerator", args.accelerator),
            ("--fit", args.fit),
            ("--rate-mbit", args.rate_mbit),
            ("--calibration", args.calibration),
        ):
            if value is not None:
                raise ValueError(f"{flag}: not with --cluster {args.cluster} (the preset sets it)")
        print_cluster_prediction(cfg, args.cluster, flags, pricing)
        return 0
    print_prediction(
        cfg,
        flags,
        pricing,
        rates_mbit=args.rate_mbit,
        accelerator=args.accelerator,
        fit_path=None if args.fit is None else Path(args.fit),
        calibration=None if args.calibration is None else Path(args.calibration),
    )
    return 0


def _cmd_extrapolate(args: argparse.Namespace) -> int:
    from cosmocub.perfmodel.uses.entry_points import extrapolate

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
        "--fit-set",
        nargs="*",
        help="one-rank points (name or study/point) the cores' speed is fitted on, reported as "
        "set fit; every other point is held out (default: perf_model.fit_set; none: no fit)",
    )
    v.add_argument("--calibration", help=CALIBRATION_HELP)
    add_config(v)
    c = cmds.add_parser(
        "calibrate",
        help="time conv blocks, dense heads and updates over a small grid on this CPU and fit "
        "their rates (the compute model of --accelerator cpu)",
    )
    c.set_defaults(handler=_cmd_calibrate)
    c.add_argument("--out", help=CALIBRATION_HELP + "; replaced")
    c.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: time each layer of the config's model on this machine's GPU with CUDA events "
        "(fp16 autocast) and write them for perf-model predict --gpu-calibration (default --out "
        "{results}/perf_model/gpu_layers.json); fails on a machine without CUDA",
    )
    c.add_argument("--batch", type=_positive, default=1, help="local batch timed (--device cuda)")
    c.add_argument(
        "--from-run",
        help="one measured run: an MLPerf result log (its systems file beside it names the "
        "accelerator and framework; batch and scale from the log) or a cosmocub GPU run folder "
        "(train_summary.json): writes --out for perf-model predict --gpu-calibration",
    )
    add_config(c)
    r = cmds.add_parser(
        "predict",
        help="a config's step on a mesh of nodes x ranks: its parts, bytes per link, epochs, "
        "Lion Cub against Lion",
    )
    r.set_defaults(handler=_cmd_predict)
    r.add_argument("--mesh", type=_mesh, help="DATAxSPATIAL ranks (or --data, --spatial)")
    r.add_argument("--data", type=_positive, help="data ranks (default: what spatial leaves)")
    r.add_argument("--spatial", type=_positive, help="ranks per sample (default: parallel.spatial)")
    r.add_argument(
        "--split", type=_split, help="D,H,W ranks of a sample (default: as training splits it)"
    )
    r.add_argument("--nodes", type=_positive, required=True)
    r.add_argument("--ranks-per-node", type=_positive, help="(default with --cluster: its own)")
    r.add_argument(
        "--cluster",
        help="a GPU system from public specifications (perfmodel.cost_model.cluster_presets: "
        "eos, perlmutter, frontier, selene, ...): its accelerator's roofline, NCCL's collectives, "
        "and the time to train",
    )
    r.add_argument(
        "--gpu-calibration",
        help="layer times measured on the cluster's GPU (perf-model calibrate --device cuda), "
        "in place of the roofline (with --cluster)",
    )
    r.add_argument(
        "--software",
        help="the software profile to price on a GPU (perfmodel.cost_model.software.PROFILES; "
        "default: a --gpu-calibration's own, else cosmocub_eager); a calibration made with "
        "another is refused without --accept-calibration",
    )
    r.add_argument(
        "--accept-calibration",
        action="store_true",
        help="apply a --gpu-calibration made against another accelerator or software than the "
        "machine asked for (refused without it)",
    )
    r.add_argument(
        "--override",
        action="append",
        help=f"YAML merged over the config (repeatable), e.g. {OVERRIDE_EG} against "
        "hierarchy: flat",
    )
    r.add_argument(
        "--rate-mbit",
        type=float,
        nargs="+",
        help="link rate(s) between nodes, one column each (default: perf_model.extrapolate."
        "link_gbit; with --fit, 0 = the fitted link)",
    )
    r.add_argument(
        "--accelerator",
        help="one of perf_model.extrapolate.accelerators, or cpu: this machine, layers timed "
        "here (default with --fit)",
    )
    r.add_argument("--fit", help="the alpha-beta fit (perf-model fit) for the links")
    r.add_argument("--calibration", help=CALIBRATION_HELP + " (with --accelerator cpu)")
    r.add_argument("--epochs", type=_positive, help="epochs to time (default: train.epochs)")
    r.add_argument(
        "--train-samples",
        type=_positive,
        help="train split's samples (default: from universes and preprocess)",
    )
    r.add_argument("--json", action="store_true", help="JSON instead of the table")
    add_config(r)
    e = cmds.add_parser("extrapolate", help="step time on GPU clusters, with its assumptions")
    e.set_defaults(handler=_cmd_extrapolate)
    e.add_argument("--model-config", required=True, help="config whose model is extrapolated")
    e.add_argument("--out", required=True, help="folder for the TSVs, plot and assumptions")
    add_config(e)
