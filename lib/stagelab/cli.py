"""The ``stagelab`` command: run a profile, print the machine, rebuild a report, list runs,
keep a run as reference evidence."""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
from pathlib import Path

from stagelab.core import outcomes, parameter_history, paths, phases, stops
from stagelab.core.errors import UserError
from stagelab.core.outcomes import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from stagelab.run import measure_command

# 0 every notebook ok; 1 a notebook failed, nothing was measured (every cell skipped), or the
# record could not be written; 2 a bad request, refused before anything was created; 130
# interrupted (Ctrl-C, SIGTERM or SIGHUP), what was made is kept (see stagelab.core.outcomes).
EXIT_USAGE = outcomes.EXIT_USAGE


def profile_names() -> str:
    """The profiles of the profiles file, read through its loader, for the help texts."""
    try:
        from stagelab.run import profiles

        return ", ".join(profiles.load_profiles())
    except (ImportError, UserError) as exc:
        return f"none readable ({exc})"


def _parser() -> argparse.ArgumentParser:
    names = profile_names()
    parser = argparse.ArgumentParser(prog="stagelab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="execute a profile's notebooks into a new run folder")
    run.add_argument("--profile", default="quick",
                     help=f"a profile of {paths.PROFILES_FILE.name}: {names}")
    run.add_argument("--only", nargs="+", default=[], metavar="NOTEBOOK",
                     help="run only these notebooks of the profile")
    run.add_argument("--param", action="append", default=[], metavar="NOTEBOOK.KEY=VALUE",
                     help="override a notebook parameter; VALUE is JSON, bare words are text (repeatable)")
    run.add_argument("--out", type=paths.given, default=paths.RUNS_DIR,
                     help="folder in which the run folder is created (default papermill_runs/)")
    run.add_argument("--from", dest="from_dir", type=paths.given, default=None, metavar="DIR",
                     help="analyse the rows of a folder made by `stagelab measure` instead of "
                          "measuring (the measuring notebooks read them)")
    run.add_argument("--rehearse-on-cpu", action="store_true",
                     help="run a profile meant to decide (gate, full) even where the preflight "
                          "says its decisive arms cannot run here: a rehearsal, deciding nothing")
    measure_command.add_arguments(sub.add_parser(
        "measure", help="measure a profile with torch alone into one folder, to analyse with "
        "`run --from`", description=measure_command.DESCRIPTION, epilog=measure_command.EPILOG))
    env = sub.add_parser("env", help="print the hardware snapshot")
    env.add_argument("--json", action="store_true", help="print JSON instead of a table")
    env.add_argument("--under-load", action="store_true",
                     help="read the PCIe link while copies keep it busy (GPU only)")
    rep = sub.add_parser("report", help="(re)build the HTML of a run folder (and its manifest, "
                         "from the notebooks, if it is lost or corrupt)")
    rep.add_argument("run_dir", type=paths.given)
    rep.add_argument("--single-file", action="store_true",
                     help="also write one self-contained HTML file that opens offline")
    rep.add_argument("--out", type=paths.given, help="where the single file goes "
                     "(default <run_dir>/<run id>_report.html); an existing file is replaced "
                     "only if it is an earlier single-file report")
    rep.add_argument("--force", action="store_true",
                     help="let --out replace an existing file (never a run's record files)")
    runs = sub.add_parser("runs", help="list run folders: profile (* where the run's notebooks "
                          "or parameters differ from it), device, trust, status")
    runs.add_argument("--root", type=paths.given, default=paths.RUNS_DIR)
    runs.add_argument("--json", action="store_true", help="print JSON instead of a table")
    keep = sub.add_parser("keep", help="copy an ok run's evidence under data/reference/ to commit "
                          "it, and regenerate data/reference/index.html")
    keep.add_argument("run_dir", type=paths.given)
    keep.add_argument("--force", action="store_true",
                      help="keep a run that is not ok or has no verdict, labelled forced")
    pre = sub.add_parser(
        "preflight", help="check in seconds whether this machine can produce the evidence",
        description="Check CUDA, pinned memory, cudaHostRegister, event timing against the host "
        "clock, NVML, free memory for the profile's largest cell, the native path, CPU features "
        "and hidden syncs of the device paths; print a table and write preflight.json. "
        "Exit status: 0 go, 3 no-go (the blocking reasons are printed), 2 a bad request.")
    pre.add_argument("--profile", default="quick",
                     help=f"the profile whose largest cell must fit in free memory: {names}")
    pre.add_argument("--out", type=paths.given, default=None,
                     help="preflight.json's path, or a folder for it "
                          "(default papermill_runs/preflight.json)")
    cmp = sub.add_parser("compare", help="put runs side by side (hardware, verdicts, stage "
                         "split, copy bandwidth, prompt peaks) with ratios to the first run")
    cmp.add_argument("runs", type=paths.given, nargs="+", metavar="RUN",
                     help="run folders (papermill_runs/<id>/) or kept runs (data/reference/...)")
    cmp.add_argument("--out", type=paths.given, default=None,
                     help="the HTML page (default papermill_runs/compare_<UTC time>.html); an "
                          "existing file is replaced only if it is an earlier compare page")
    cmp.add_argument("--force", action="store_true",
                     help="let --out replace an existing file (never a run's record files)")
    cmp.add_argument("--json", action="store_true",
                     help="print the comparison as JSON instead of a table (the page is still "
                          "written; its path goes to stderr)")
    fleet = sub.add_parser(
        "fleet", help="measure a profile on every GPU node of a Ray cluster and compare them",
        description="Run `stagelab measure` once on each chosen node of an existing Ray cluster "
        "(all in parallel, never two on one node; the checkout travels through Ray's runtime "
        "environment, the node's own Python and torch measure), bring each measured folder back "
        "through Ray, analyse it with `run --from`, and write a fleet folder: fleet.json and a "
        "page with the verdict per platform. Needs the fleet extra: pip install -e '.[fleet]'.",
        epilog="Exit status: 0 every node ok, 1 some node failed, timed out or was unavailable, "
        "2 a bad request (no Ray, no cluster at the address, no matching node, a bad profile).")
    fleet.add_argument("--address", required=True,
                       help="the Ray cluster: HOST:PORT of its head (as `ray start --head` "
                            "prints), or auto")
    fleet.add_argument("--profile", default="gate", help="the profile every node measures")
    fleet.add_argument("--param", action="append", default=[], metavar="NOTEBOOK.KEY=VALUE",
                       help="override a notebook parameter on every node (repeatable)")
    fleet.add_argument("--out", type=paths.given, default=paths.RUNS_DIR,
                       help="where the fleet folder is created (default papermill_runs/)")
    fleet.add_argument("--timeout-s", type=float, default=1800.0, metavar="S",
                       help="per node, from its start: it stops and sends what it measured "
                            "(timed out); cancelled if nothing comes back soon after")
    fleet.add_argument("--accelerator-type", action="append", default=[], metavar="TYPE",
                       help="only nodes of Ray's accelerator_type TYPE, e.g. H100 (repeatable)")
    fleet.add_argument("--resource", default=None, metavar="NAME",
                       help="only nodes holding the custom resource NAME (for tests)")
    fleet.add_argument("--force", action="store_true",
                       help="measure even where a node's preflight says no-go (recorded; "
                            "without it such a node is unavailable); never past no CUDA")
    fleet.add_argument("--rehearse-on-cpu", action="store_true",
                       help="rehearse on nodes without CUDA or pinned memory (recorded; never "
                            "evidence)")
    add_predict_arguments(sub.add_parser(
        "predict", help="predict the verdict's answers per GPU platform from measured host "
        "rates and published link figures (no GPU needed)", description=PREDICT_DESCRIPTION))
    return parser


PREDICT_DESCRIPTION = (
    "Predict, per GPU platform and decisive cell, each arm's step time (an interval from the "
    "published and assumed ranges of data/platforms.csv) and the three answers the verdict asks "
    "(bundle, reuse alone, pinning alone): PORT, CLOSE or 'depends on X', with the dominating "
    "term, the inputs that flip each answer, and the n x V where each platform crosses the bar. "
    "No GPU needed; the host rates are each platform's usual host classes (data/hosts.csv) "
    "unless --host or --rates says otherwise. Predicted, never measured.")


def add_predict_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``stagelab predict`` (here, so that building the parser loads no
    pandas: ``stagelab measure`` runs with torch and the standard library alone)."""
    parser.add_argument("--platform", action="append", default=[], metavar="NAME",
                        help="a platform of data/platforms.csv, e.g. H200 (repeatable; "
                             "default: every platform)")
    parser.add_argument("--profile", default="gate",
                        help="the profile whose decisive cells are predicted (default gate)")
    parser.add_argument("--rates", type=paths.given, default=None, metavar="DIR",
                        help="take the host rates from a run, kept run or measured folder "
                             "(that run's own host)")
    parser.add_argument("--host", default=None, metavar="NAME",
                        help="the host to assume: a class of data/hosts.csv, or 'this' (this "
                             "machine, measured now, its load watched); default: each "
                             "platform's usual host classes, nothing measured")
    parser.add_argument("--thp", default=None, choices=("always", "madvise", "never"),
                        help="the host's transparent huge page mode (default: the host "
                             "class's range of modes)")
    parser.add_argument("--regime", default=None, choices=("faulted", "mapped", "auto"),
                        help="the fresh vector's allocator regime: faulted afresh each step, "
                             "pages found mapped, or auto (by size, as glibc: faulted above "
                             "32 MiB, either below)")
    parser.add_argument("--delta", type=float, default=0.02,
                        help="the bar: a saving of this share of the decode step (default 0.02)")
    parser.add_argument("--json", action="store_true",
                        help="print the answers and arms as JSON (the records notebook 05 writes "
                             "to prediction.json)")


def cmd_run(args: argparse.Namespace) -> int:
    from stagelab.core import rundir
    from stagelab.run import execute, profiles

    if args.from_dir is not None:
        from stagelab.run import replay

        replay.check_overrides(args.param)
    plan = profiles.plan_run(args.profile, args.only, profiles.parse_overrides(args.param))
    if plan.decides and args.from_dir is None and not args.rehearse_on_cpu:
        refuse_undecidable(plan)
    origin = None
    if args.from_dir is not None:
        from stagelab.run import replay

        origin = replay.replay_plan(plan, args.from_dir, args.param)
        _say(replay.source_line(origin))
    try:
        run_dir, manifest = execute.run(plan, args.out, command=["stagelab", *sys.argv[1:]],
                                       measured=origin)
    finally:  # a run that never took in the verified copy leaves no copy behind
        if origin is not None and Path(origin["staged"]).exists():
            shutil.rmtree(Path(origin["staged"]).parent, ignore_errors=True)
    if line := phases.summary_line(manifest):
        _say(line)
    _say(f"report: {run_dir / 'index.html'}", sys.stdout)
    _say(verdict_line(run_dir, manifest), sys.stdout)
    for line in next_step_lines(run_dir, manifest):
        _say(line, sys.stdout)
    if origin is not None and (origin["status"] != outcomes.OK or origin["gaps"]):
        _say(f"the measurement replayed is {origin['status']}, not ok: "
             f"{'; '.join(origin['gaps']) or 'see its measured.json'}; keep refuses this run "
             "without --force")
    if manifest["status"] == rundir.INTERRUPTED:
        _say("run interrupted; what was produced is kept")
        return EXIT_INTERRUPTED
    failed = [nb["name"] for nb in manifest["notebooks"] if nb["status"] != rundir.OK]
    if failed:
        _say(f"run failed: {', '.join(failed)} (see the manifest and their notebooks)")
        return EXIT_FAILED
    if manifest["status"] == rundir.UNMEASURED:
        _say(f"run {rundir.nothing_measured(manifest)}: every cell was skipped or unavailable "
             "here (see the notebooks for why)")
        return EXIT_FAILED
    return EXIT_OK


def refuse_undecidable(plan) -> None:
    """UserError, before anything is created, where a profile meant to decide cannot: the
    preflight says its decisive arms cannot run on this machine (no CUDA device, no native
    build). Running it anyway would measure for minutes and decide nothing."""
    from stagelab.measure import preflight
    from stagelab.run import profiles

    blockers = preflight.decisive_blockers(profiles.profile_parameters(plan.profile))
    if blockers:
        raise UserError(f"profile {plan.profile!r} decides, but its decisive arms cannot run "
                        f"here ({blockers[0]}); measure it on a GPU node (`stagelab measure`, "
                        "then `run --from`), or pass --rehearse-on-cpu to run it anyway, "
                        "deciding nothing")


def _say(text: str, stream=None) -> None:
    """Print lines, each with its control characters escaped; a terminal closed under the
    run (SIGHUP) is not an error."""
    with contextlib.suppress(OSError):
        print("\n".join(outcomes.printable(line) for line in str(text).split("\n")),
              file=stream or sys.stderr, flush=True)


def _progress(line: str) -> None:
    """A step of a command that takes seconds (report, keep), on stderr where a person watches
    it (a terminal): stdout keeps only the paths the command made, and a script's stderr only
    the error, in one line."""
    if sys.stderr.isatty():
        _say(line)


def next_step_lines(run_dir: Path, manifest: dict) -> list[str]:
    """After an undecided verdict: what a GPU is predicted to answer and the command that
    confirms it (:func:`stagelab.present.next_step.terminal_lines`); after any verdict, the
    prompt-logprob chunk's answer (``prompt chunk: ...``); none without a verdict."""
    from stagelab.analyse import verdict_words
    from stagelab.core.records import RunFolder
    from stagelab.present import next_step

    try:
        verdict = RunFolder(run_dir).read_verdict()
    except UserError:
        return []
    chunk = verdict_words.chunk_answer(verdict)
    return [*next_step.terminal_lines(run_dir, verdict, manifest.get("profile")),
            *([f"prompt chunk: {chunk}"] if chunk else [])]


def verdict_line(run_dir: Path, manifest: dict) -> str:
    """The run's last words: its verdict in one line (or why there is none), and a warning line
    when its timings are not trustworthy."""
    from stagelab.analyse import trust
    from stagelab.core.records import RunFolder

    try:
        verdict = RunFolder(run_dir).read_verdict()
    except UserError as exc:
        verdict, line = {}, f"verdict: unreadable ({exc})"
    else:
        if verdict is None:
            verdict, line = {}, "verdict: none (the verdict notebook did not run or did not finish)"
        else:
            overall = verdict["overall"]
            line = f"verdict: {overall['decision']} - {overall.get('summary', '')}".rstrip(" -")
    lines = [line, trust.scope_label(verdict),
             trust.headline(trust.reasons(run_dir, manifest, verdict))]
    return "\n".join(text for text in lines if text)


def cmd_env(args: argparse.Namespace) -> int:
    from stagelab.measure import hardware
    from stagelab.present import machine

    snap = hardware.snapshot(under_load=args.under_load)
    if args.json:
        print(json.dumps(snap, indent=2))
        return EXIT_OK
    for section, key, value in machine.flatten(snap):
        if key.endswith("_bytes") and isinstance(value, int):
            value = f"{value} ({value / 2**30:.1f} GiB)"
        print(f"{section:12} {key:34} {value}")
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    from stagelab.core import rundir
    from stagelab.present import report
    from stagelab.run import execute

    if args.out and not args.single_file:
        raise UserError("--out names the single file: add --single-file")
    if args.single_file:  # refuse a bad --out before anything is written
        report.single_file_out(args.run_dir, args.out, args.force)
    index = execute.rebuild_report(args.run_dir, _progress)
    note = rundir.read_manifest(args.run_dir).get("note")
    if note:
        print(f"note: the manifest was {note}", file=sys.stderr)
    print(index)
    if args.single_file:
        print(report.write_single_file(args.run_dir, args.out, args.force, _progress))
    return EXIT_OK


def cmd_runs(args: argparse.Namespace) -> int:
    from stagelab.core import rundir

    listed = [run_listing(run, Path(args.root) / run.run_id)
              for run in rundir.list_runs(args.root)]
    if args.json:
        print(json.dumps(listed, indent=2))
        return EXIT_OK
    if not listed:
        print(f"no run folders under {args.root}")
        return EXIT_OK
    print(RUNS_ROW.format("run id", "profile", "started (UTC)", "device", "trust", "status"))
    for run in listed:
        details = "".join(f"  {status}: {', '.join(names)}"
                          for status, names in run["not_delivered"].items())
        changed = f"  * {'; '.join(run['changed'])}" if run["changed"] else ""
        print(outcomes.printable(
            RUNS_ROW.format(run["run_id"], (run["profile"] or "") + ("*" if changed else ""),
                            run["created_utc"] or "", run["device"] or "", run["trust"] or "",
                            run["status"])
            + f"{details}{changed}{'  (' + run['problem'] + ')' if run['problem'] else ''}"))
    return EXIT_OK


RUNS_ROW = "{:48} {:11} {:26} {:24} {:16} {}"  # `stagelab runs`: the header and each run


def run_listing(run, run_dir: Path) -> dict:
    """One run of ``stagelab runs`` as JSON-ready fields: its summary, its timings' trust
    (:func:`stagelab.analyse.trust.run_trust`) and how it differs from its profile."""
    from stagelab.analyse import trust
    from stagelab.core import rundir

    manifest = None if run.problem else rundir.effective_manifest(run_dir)
    return {"run_id": run.run_id, "profile": run.profile, "created_utc": run.created_utc,
            "device": run.device, "status": run.status, "problem": run.problem,
            "trust": trust.run_trust(run_dir, manifest) if manifest else None,
            "changed": profile_changes(manifest) if manifest else [],
            "not_delivered": {status: names for status in rundir.NOT_DELIVERED
                              if (names := run.not_delivered(status))}}


def profile_changes(manifest: dict) -> list[str]:
    """How a run differs from the profile it names, in words: notebooks left out (``--only``)
    and parameters changed (``--param``); empty for a run of the profile as it stands, or of a
    profile this checkout does not know (an interactive run, another checkout's profiles)."""
    from stagelab.run import profiles

    try:
        profile = (profiles.load_profiles().get(manifest.get("profile", "")) or {}).get("notebooks")
    except UserError:
        return []
    if not profile:
        return []
    entries = {e["name"]: parameter_history.current(e["name"], e.get("parameters") or {})
               for e in manifest.get("notebooks") or []}
    out = [f"only {', '.join(entries)}"] if set(entries) < set(profile) else []
    for name, given in entries.items():
        wanted = parameter_history.current(name, profile.get(name) or {})
        changed = [f"{key}={given.get(key)!r}" for key in sorted({*given, *wanted})
                   if given.get(key) != wanted.get(key)]
        if changed:
            out.append(f"{name}: {', '.join(changed)}")
    return out


def cmd_keep(args: argparse.Namespace) -> int:
    from stagelab.present import evidence

    dest = evidence.keep_evidence(args.run_dir, force=args.force, say=_progress)
    print(dest)
    print(f"index: {dest.parent.parent / evidence.INDEX}", file=sys.stderr)
    return EXIT_OK


def cmd_preflight(args: argparse.Namespace) -> int:
    from stagelab.measure import preflight
    from stagelab.run import profiles

    parameters = profiles.profile_parameters(args.profile)  # an unknown profile stops here
    return preflight.preflight(args.profile, parameters, args.out)


def cmd_compare(args: argparse.Namespace) -> int:
    from stagelab.present import compare

    out = compare.claim_out(args.out, args.force)  # refused before any run is read
    comparison = compare.compare(args.runs)
    if args.json:
        page = compare.write_html(comparison, out, args.force)
        print(json.dumps(compare.to_json(comparison), indent=2, allow_nan=False))
        print(f"page: {page}", file=sys.stderr)
        return EXIT_OK
    for note in comparison.notes:
        print(f"note: {note}", file=sys.stderr)
    print(compare.render_text(comparison))
    print(f"page: {compare.write_html(comparison, out, args.force)}")
    return EXIT_OK


def cmd_fleet(args: argparse.Namespace) -> int:
    from stagelab.run import fleet

    plan = fleet.check_request(args.profile, args.param, args.timeout_s, args.force,
                               args.rehearse_on_cpu)
    code, folder = fleet.run_fleet(args.address, plan, args.out, args.accelerator_type,
                                   args.resource)
    print(fleet.summary_line(code, folder))
    return code


def cmd_predict(args: argparse.Namespace) -> int:
    from stagelab.run import predict_command

    return predict_command.main(args)


def cmd_measure(args: argparse.Namespace) -> int:
    request = measure_command.checked_request(args, ["stagelab", *sys.argv[1:]])
    return measure_command.EXIT_OK if request is None else measure_command.measure(request)


COMMANDS = {"run": cmd_run, "measure": cmd_measure, "env": cmd_env, "report": cmd_report, "runs": cmd_runs,
            "keep": cmd_keep, "preflight": cmd_preflight, "compare": cmd_compare,
            "fleet": cmd_fleet, "predict": cmd_predict}


def main(argv: list[str] | None = None) -> int:
    """Entry point; user errors print one line and exit 2, never a traceback; a record that
    cannot be written (a full disk) prints one line and exits 1. ``measure`` imports nothing
    but torch and the standard library."""
    from stagelab.core.rundir import RecordError

    with outcomes.escaped_output():  # every printed line of every command, escaped
        args = _parser().parse_args(argv)
        return outcomes.one_line_errors("stagelab", lambda: COMMANDS[args.command](args),
                                        also=(RecordError,))


def console(argv: list[str] | None = None) -> int:
    """The ``stagelab`` command's process: :func:`main`, then a quiet end, in which a stop
    signal exits at once with main's status (see :func:`stops.end_quietly`). Not for a caller
    that goes on after it, whose own Ctrl-C it would take over."""
    status = main(argv)
    stops.end_quietly(status)
    return status
