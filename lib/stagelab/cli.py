"""The ``stagelab`` command: run a profile, print the machine, rebuild a report, list runs,
keep a run as reference evidence."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from stagelab import paths

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stagelab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="execute a profile's notebooks into a new run folder")
    run.add_argument("--profile", default="quick", help="a profile of profiles.yaml (quick, full)")
    run.add_argument("--only", nargs="+", default=[], metavar="NOTEBOOK",
                     help="run only these notebooks of the profile")
    run.add_argument("--param", action="append", default=[], metavar="NOTEBOOK.KEY=VALUE",
                     help="override a notebook parameter; VALUE is YAML (repeatable)")
    run.add_argument("--out", type=Path, default=paths.RUNS_DIR,
                     help="folder in which the run folder is created (default papermill_runs/)")
    env = sub.add_parser("env", help="print the hardware snapshot")
    env.add_argument("--json", action="store_true", help="print JSON instead of a table")
    env.add_argument("--under-load", action="store_true",
                     help="read the PCIe link while copies keep it busy (GPU only)")
    rep = sub.add_parser("report", help="(re)build the HTML of a run folder")
    rep.add_argument("run_dir", type=Path)
    rep.add_argument("--single-file", action="store_true",
                     help="also write one self-contained HTML file that opens offline")
    rep.add_argument("--out", type=Path, help="where the single file goes "
                     "(default <run_dir>/<run id>_report.html)")
    runs = sub.add_parser("runs", help="list run folders")
    runs.add_argument("--root", type=Path, default=paths.RUNS_DIR)
    keep = sub.add_parser("keep", help="copy a run's evidence under data/reference/ to commit it")
    keep.add_argument("run_dir", type=Path)
    return parser


def cmd_run(args: argparse.Namespace) -> int:
    from stagelab import runs

    plans = runs.plan_run(args.profile, args.only, runs.parse_overrides(args.param))
    run_dir = runs.new_run_dir(args.out, args.profile)
    print(f"run folder: {run_dir}", file=sys.stderr)
    manifest = runs.execute(plans, run_dir, args.profile, command=["stagelab", *sys.argv[1:]])
    print(f"report: {run_dir / 'index.html'}")
    if manifest["status"] == "interrupted":
        print("run interrupted; what was produced is kept", file=sys.stderr)
        return EXIT_INTERRUPTED
    failed = [nb["name"] for nb in manifest["notebooks"] if nb["status"] == "failed"]
    if failed:
        print(f"run failed: {', '.join(failed)} (see the manifest and their notebooks)",
              file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def cmd_env(args: argparse.Namespace) -> int:
    from stagelab import hardware

    snap = hardware.snapshot(under_load=args.under_load)
    if args.json:
        print(json.dumps(snap, indent=2))
        return EXIT_OK
    for section, key, value in hardware.flatten(snap):
        if key.endswith("_bytes") and isinstance(value, int):
            value = f"{value} ({value / 2**30:.1f} GiB)"
        print(f"{section:12} {key:34} {value}")
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    from stagelab import report, runs
    from stagelab.errors import UserError

    if args.out and not args.single_file:
        raise UserError("--out names the single file: add --single-file")
    print(runs.rebuild_report(args.run_dir))
    if args.single_file:
        print(report.write_single_file(args.run_dir, args.out))
    return EXIT_OK


def cmd_runs(args: argparse.Namespace) -> int:
    from stagelab import runs

    listed = runs.list_runs(args.root)
    if not listed:
        print(f"no run folders under {args.root}")
    for run in listed:
        failed = f"  failed: {', '.join(run['failed'])}" if run.get("failed") else ""
        print(f"{run['run_id']:48} {run.get('profile') or '':8} {run.get('created_utc') or '':26}"
              f" {run.get('device') or '':24} {run['status']}{failed}")
    return EXIT_OK


def cmd_keep(args: argparse.Namespace) -> int:
    from stagelab import runs

    print(runs.keep_evidence(args.run_dir))
    return EXIT_OK


COMMANDS = {"run": cmd_run, "env": cmd_env, "report": cmd_report, "runs": cmd_runs,
            "keep": cmd_keep}


def main(argv: list[str] | None = None) -> int:
    """Entry point; user errors print one line and exit 2, never a traceback."""
    from stagelab.errors import UserError

    args = _parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except UserError as exc:
        print(f"stagelab: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("stagelab: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
