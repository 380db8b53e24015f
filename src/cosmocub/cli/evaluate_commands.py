"""`cosmocub evaluate | evaluate-fields | summarize`: a trained run's test-set metrics and plots,
the U-Net's field statistics, and the one-page summary of a workflow.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cosmocub.cli.common import add_config, add_stage
from cosmocub.config import load_config


def _run_evaluation(args: argparse.Namespace, stage: str, evaluate_stage) -> int:
    """`evaluate_stage(cfg, shards_dir=, run_dir=, out_dir=, tracker=)` inside the job's MLflow
    run: the one shape of both evaluate commands."""
    from cosmocub.tracking.runs import job_run

    cfg = load_config(args.config)
    with job_run(cfg, stage=stage) as tracker:
        evaluate_stage(
            cfg,
            shards_dir=Path(args.shards),
            run_dir=Path(args.run_dir),
            out_dir=Path(args.out),
            tracker=tracker,
        )
    return 0


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from cosmocub.evaluation.evaluate_run import evaluate

    return _run_evaluation(args, "evaluate", evaluate)


def _cmd_evaluate_fields(args: argparse.Namespace) -> int:
    from cosmocub.emulator.evaluate_emulator import evaluate_fields

    return _run_evaluation(args, "evaluate_fields", evaluate_fields)


def _cmd_summarize(args: argparse.Namespace) -> int:
    from cosmocub.evaluation.report import write_summary

    write_summary(
        manifest_path=Path(args.manifest),
        metrics_paths=[Path(p) for p in args.metrics],
        out_path=Path(args.out),
        study_sections=[Path(p) for p in args.studies or ()],
    )
    return 0


def add_evaluate(sub) -> None:
    p = add_stage(sub, "evaluate", _cmd_evaluate, "test-set metrics and plots for a trained run")
    p.add_argument("--shards", required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--out", required=True)
    add_config(p)


def add_summarize(sub) -> None:
    p = add_stage(
        sub, "summarize", _cmd_summarize, "one-page markdown summary of shards and evaluations"
    )
    p.add_argument("--manifest", required=True)
    p.add_argument("--metrics", nargs="+", required=True, help="evaluation metrics.json files")
    p.add_argument("--studies", nargs="*", help="studies' summary.md sections to append")
    p.add_argument("--out", required=True)


def add_evaluate_fields(sub) -> None:
    p = add_stage(
        sub,
        "evaluate-fields",
        _cmd_evaluate_fields,
        "test-set P(k) transfer, r(k), one-point PDF and slices of a U-Net run vs linear growth",
    )
    p.add_argument("--shards", required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--out", required=True)
    add_config(p)
