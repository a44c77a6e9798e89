"""`pddlab`: the command-line entry point that the Makefile wraps.

Responsible for: parsing arguments, validating them before anything starts,
turning errors into one clear line and an exit status, and dispatching to
experiments and maintenance commands. Not responsible for: the experiments.

    pddlab profiles                      list the shipped netem profiles
    pddlab check-profile FILE...         validate profile files
    pddlab check-topology FILE... [--pools p=N,rld=N,md=N]
                                         validate topology files; print sites, hosts, lines (topology.topofile)
    pddlab run [EXPERIMENT] [--profile NAME] [--backend auto|tc|userspace] [--set KEY=VALUE ...] [--cluster ADDR]
    pddlab sweep [EXPERIMENT] --over KEY=V1,V2,... [--over ...] [--repeat N] [--set ...] [--profile NAME]
                                         the experiment over a grid of values x repeats (experiments.run.sweep)
    pddlab sweep --resume SWEEP_DIR      run the points an interrupted sweep had not finished (a finished one:
                                         read its runs again, e.g. after pddlab analyze, and rewrite sweep.md)
    pddlab analyze RUN_DIR               recompute summary and plots of a serving experiment's run
    pddlab compare DIR DIR [DIR ...] [--json FILE]
                                         runs (or sweeps) of one spec side by side: ratios, intervals, verdicts
    pddlab serve [EXPERIMENT] [--profile NAME] [--mode pdd] [--port 8000] [--set KEY=VALUE ...]
                                         the roles behind an OpenAI-compatible API until Ctrl-C
                                         (experiments.serve.session)
    pddlab net [--profile NAME] [--exec LINE ...]
                                         the topology alone with Mininet's CLI (experiments.serve.netshell)
    pddlab simulate [EXPERIMENT] [--set KEY=VALUE ...] [--requests N] [--seed S] [--out DIR]
                    [--sweep KEY=V1,V2,... ...] [--sla 0.9]
                                         the spec's variants in the discrete-event simulator (experiments.sim)
    pddlab experiments                   list the experiments
    pddlab image [--no-cache] [--base-image REF] [--variant cpu|cuda]
                                         build the worker image unless it is up to date (docker_rt.image)
    pddlab clean [--cluster ADDRESS]     remove leftovers of crashed runs (--cluster: a Ray cluster's, ray_rt.ledger)

Experiments: `link-calibration` (experiments/run/calibration.py) and every spec in
experiments/specs/*.yaml (serving experiments, experiments/run/runner.py); the
default is `pdd-vs-baselines`.

Exit status (EXIT_CODES; docs/spec.md "Exit codes"): 0 done as asked, 1 a variant, run or sweep point
failed, 2 bad input, 3 the environment (not root, Docker or a Ray cluster unavailable), 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from experiments.run import calibration, outcome
from experiments.analysis.linkstats import ProbePlan
from experiments.spec.experiment import SpecError, available_specs
from experiments.run.sweep import SweepError
from experiments.spec.workload import TraceError
from topology.naming import CROSS_ROLE
from topology.profiles import DIRECTIONS, ProfileError, available_profiles, load_profile
from topology.rate_trace import WINDOW_MS, load_trace, rate_schedule
from topology.shaping import BACKENDS
from topology.topofile import POOLS, TopologyError, gateway_ip, host_specs, line_specs, load_topology

log = logging.getLogger("pddlab")
OK, FAILED, BAD_INPUT, ENVIRONMENT, INTERRUPTED = 0, 1, 2, 3, 130
EXIT_CODES = f"""exit status:
  {OK}    done as asked: every variant ran and was analysed (requests that failed under impairment are data)
  {FAILED}    a variant, the run or a sweep point failed (the run directory / sweep.json says which and why)
  {BAD_INPUT}    bad input: an unknown experiment or profile, a bad --set, --over or option
  {ENVIRONMENT}    the environment: not root, Mininet or tools missing, Docker or a Ray cluster unavailable
  {INTERRUPTED}  interrupted (Ctrl-C, SIGTERM): everything the run made was torn down"""
DEFAULT_EXPERIMENT = "pdd-vs-baselines"
DEFAULT_PROFILE = "wan-cross-country"
CALIBRATION = "link-calibration"


def experiments() -> list[str]:
    """Every experiment name: link-calibration, then the serving specs."""
    return [CALIBRATION] + available_specs()


def _profiles(_args) -> int:
    print(f"{'name':<20} {'rate Mbit/s':>11} {'delay ms':>8} {'jitter ms':>9} {'loss %':>7}  description")
    for name in available_profiles():
        p = load_profile(name)
        d = p.a_to_b
        print(
            f"{name:<20} {d.rate_mbit:>11g} {d.delay_ms:>8g} {d.jitter_ms:>9g} "
            f"{d.expected_loss_pct:>7.3g}  {p.description}"
        )
    return 0


def _check_profile(args) -> int:
    for path in args.files:
        profile = load_profile(Path(path))
        print(f"{path}: ok")
        _print_directions(profile, "  ")
    return 0


def _print_directions(profile, indent: str, names: tuple[str, str] = DIRECTIONS) -> None:
    """Each direction's netem line (named `names`: a line's own, forward first), and a trace's rate plan."""
    for name, (direction, line) in zip(names, profile.netem_lines().items()):
        print(f"{indent}{name}: netem {line}")
        if trace_file := profile.direction(direction).rate_trace:  # the rate is the trace's, not in the line
            trace = load_trace(trace_file)
            plan = rate_schedule(trace)
            print(
                f"{indent}{name}: rate_trace {trace_file}: mean {trace.mean_rate_mbit():.2f} Mbit/s over "
                f"{trace.period_ms} ms, looping; tc: one rate per {WINDOW_MS} ms window, "
                f"within {plan.max_window_error_pct:.1f}% of the mean"
            )


def _check_topology(args) -> int:
    pools = _pool_counts(args.pools)
    for path in args.files:
        topo = load_topology(Path(path))
        hosts, lines = host_specs(topo, pools, cross=True), line_specs(topo)
        print(f"{path}: ok ({topo.name}: {len(topo.sites)} site(s), {len(lines)} line(s))")
        for site in topo.sites:
            here = ", ".join(f"{pool}: {'all (--pools)' if n is None else n}" for pool, n in site.pools.items())
            print(
                f"  site {site.name} {site.subnet}: gateway {site.gateway} {gateway_ip(site)}, switch {site.switch}"
                + (f"; pools {here}" if here else "")
            )
            for h in (h for h in hosts if h.cluster == site.name):
                cross = " (made only with cross traffic)" if h.role == CROSS_ROLE else ""
                print(f"    {h.name:<8} {h.ip:<15} {h.role}{cross}")
        for ln in lines:
            a, b = ln.ends
            route = f"route {ln.route}" + (f", choose {ln.choose}" if ln.choose else "")
            print(
                f"  line {ln.name} {a.site}-{b.site}: {a.interface} {a.ip} - {b.interface} {b.ip} "
                f"(/{ln.prefixlen}), {route if ln.route else 'its pair of sites has no other line'}"
            )
            _print_directions(ln.profile, "    ", tuple(ln.directions()))
    return 0


def _pool_counts(text: str) -> dict[str, int]:
    """--pools p=2,md=3 -> {"p": 2, "md": 3}."""
    out = {}
    for item in filter(None, text.split(",")):
        role, _, n = item.partition("=")
        if role not in POOLS or not n.isdigit():
            raise UsageError(f"--pools {item!r}: expected POOL=N with POOL one of {', '.join(POOLS)}")
        out[role] = int(n)
    return out


def _run(args) -> int:
    if args.experiment == CALIBRATION:
        return _run_calibration(args)
    known = experiments()
    if args.experiment not in known and not args.experiment.endswith((".yaml", ".yml")):
        raise UsageError(f"unknown experiment {args.experiment!r}; available: {', '.join(known)}")
    from experiments.run import runner
    from experiments.spec import experiment as spec

    sets = list(args.set) + (["runtime=ray", f"cluster.address={args.cluster}"] if args.cluster else [])
    loaded = spec.load(
        args.experiment, sets, profile=args.profile, backend=None if args.backend == "auto" else args.backend
    )
    # the workload and trace, the cluster's address: fail before anything (the profile parsed once, at load)
    plan = runner.prepare(loaded.spec, loaded.profile)
    if not loaded.spec.cluster.address:  # on an existing Ray cluster there is no topology to build here
        _check_environment()
    out = runner.run(plan, results=Path(args.results)) if args.results else runner.run(plan)
    md = out / "summary.md"
    print(md.read_text() if md.exists() else "(no summary)")
    print(f"run directory: {out}")
    return _outcome(outcome.failures(out), f"run directory {out}")


def _check_environment() -> None:
    """What the emulated topology needs here (topology.net.preflight: root, Mininet, tools, a free name
    prefix), checked before anything starts: EnvironmentProblem otherwise."""
    from topology.net import TestbedError, preflight

    try:
        preflight()
    except TestbedError as err:
        raise EnvironmentProblem(str(err)) from None


def _outcome(problems: list[str], where: str) -> int:
    """FAILED, with each problem on a line of its own, or OK when there is none."""
    for problem in problems:
        print(f"pddlab: failed: {problem}", file=sys.stderr)
    if problems:
        print(f"pddlab: {len(problems)} failure(s); see {where}", file=sys.stderr)
    return FAILED if problems else OK


def _sweep(args) -> int:
    from experiments.run import sweep

    if args.resume:
        if args.over or args.set or args.profile:
            raise UsageError("--resume runs the sweep's own plan (its sweep.json): drop --over, --set and --profile")
        out = Path(args.resume)
        plan, points = sweep.resume(out)
    else:
        if args.experiment == CALIBRATION:
            raise UsageError("link-calibration is not a serving spec; sweep one of: " + ", ".join(experiments()[1:]))
        plan = sweep.Plan(
            spec=args.experiment,
            set_items=tuple(args.set),
            profile=args.profile,
            backend=None if args.backend == "auto" else args.backend,
            axes=tuple(sweep.parse_over(o) for o in args.over),
            repeat=args.repeat,
            same_seed=args.same_seed,
            share_topology=args.share_topology,
        )
        points = sweep.validate(plan)  # every point's spec and workload: fail before anything starts
        out = None
    if sweep.needs_topology(plan) and any(p.status != "complete" for p in points):
        _check_environment()  # a finished sweep resumed only writes its report again (no root, no topology)
    out = out or sweep.new_sweep_dir(plan, Path(args.results) if args.results else sweep.rundir.RESULTS)
    sweep.run(plan, out, points)
    print((out / "sweep.md").read_text())
    print(f"sweep directory: {out}")
    return _outcome(sweep.failed_points(out, points), f"{out / 'sweep.md'}")


def _analyze(args) -> int:
    from experiments.analysis import analyze

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: no such run directory")
    try:
        analyze.analyze(run_dir)
    except analyze.AnalysisError as err:
        raise UsageError(str(err)) from None
    print((run_dir / "summary.md").read_text())
    return 0


def _compare(args) -> int:
    from experiments.analysis import compare, summary as summary_mod

    dirs = [Path(d) for d in args.dirs]
    for d in dirs:
        if not d.is_dir():
            raise UsageError(f"{d}: no such directory")
    try:
        rows = compare.compare(dirs)
    except (compare.CompareError, summary_mod.SummaryError) as err:
        raise UsageError(str(err)) from None
    print(compare.markdown(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(compare.to_json(rows), indent=2) + "\n")
    return 0


def _default_topology_only(spec, what: str) -> None:
    """Refuse a spec whose topology file is not the default where `what` knows the two-cluster network only."""
    from experiments.spec import sites

    if not sites.is_default(spec):
        raise UsageError(f"topology={spec.topology!r}: {what} runs the default topology (two-clusters) only, for now")


def _simulate(args) -> int:
    from experiments.sim import compiled as sim_compiled, config as sim_config, simulate, wan

    if args.requests is not None and args.requests < 1:
        raise UsageError(f"--requests={args.requests}: expected at least 1")
    if args.sweep:
        return _simulate_sweep(args)
    try:
        loaded = sim_config.load_for_simulation(args.experiment, args.set)
        _default_topology_only(loaded.spec, "the simulator (one WAN line)")
        run = simulate.simulate(loaded, requests=args.requests, seed=args.seed)
    except (sim_config.SimError, wan.CalibrationError) as err:
        raise UsageError(str(err)) from None
    out = simulate.write_run(run, loaded, Path(args.out) if args.out else None)
    print((out / "summary.md").read_text())
    build = "compiled" if sim_compiled.loaded() else "pure Python"  # experiments.sim.compiled: same records
    rate = f"{run.requests_per_s:,.0f} requests/s, {build}"
    print(f"simulated {run.requests} requests in {run.sim_wall_s:.1f} s ({rate})")
    print(f"run directory: {out}")
    return OK


def _simulate_sweep(args) -> int:
    from experiments.rundir.files import new_run_dir
    from experiments.sim import config as sim_config, simulate, sweep, wan

    try:
        axes = sweep.parse_axes(args.sweep)
        out = Path(args.out) if args.out else new_run_dir(f"{Path(args.experiment).stem}-simsweep", simulate.RESULTS)
        sweep.run(args.experiment, args.set, axes, args.requests, args.seed, out, args.sla)
    except (sweep.SimSweepError, sim_config.SimError, wan.CalibrationError) as err:
        raise UsageError(str(err)) from None
    print((out / "sweep.md").read_text())
    print(f"sweep directory: {out}")
    return OK


def _serve(args) -> int:
    from experiments.serve import session as serve
    from experiments.spec import experiment as spec

    known = experiments()[1:]
    if args.experiment not in known and not args.experiment.endswith((".yaml", ".yml")):
        raise UsageError(f"unknown serving spec {args.experiment!r}; available: {', '.join(known)}")
    if not 1 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: not a TCP port")
    if args.max_in_flight < 1:
        raise UsageError(f"--max-in-flight {args.max_in_flight}: at least 1")
    s = spec.load_spec(
        args.experiment, args.set, profile=args.profile, backend=None if args.backend == "auto" else args.backend
    )
    _default_topology_only(s, "pddlab serve")
    _check_environment()
    try:
        out = serve.run(s, mode=args.mode, port=args.port, max_in_flight=args.max_in_flight)
    except serve.SessionFailed as err:  # it served, then failed: exit 1, as a failed run
        return _outcome([str(err)], "the session's logs")
    except serve.ServeError as err:
        raise UsageError(str(err)) from None
    print(f"session directory: {out}")
    return 0


def _net(args) -> int:
    from experiments.serve import netshell
    from topology.net import TestbedError

    if args.profile:
        load_profile(args.profile)  # a bad profile is bad input, whatever the machine
    try:
        topology = netshell.topology_of(args.topo, args.custom)  # so is a bad topology file or class
    except TestbedError as err:  # no Mininet library to read a class with
        raise EnvironmentProblem(str(err)) from None
    profile = args.profile or (None if topology else DEFAULT_PROFILE)
    _check_environment()
    return netshell.run(profile, args.backend, args.cross_hosts, tuple(args.exec), topology=topology)


def _experiments(_args) -> int:
    print("\n".join(experiments()))
    return 0


def _run_calibration(args) -> int:
    if args.set:
        raise UsageError("link-calibration takes no --set overrides")
    profile = load_profile(args.profile or DEFAULT_PROFILE)
    cfg = calibration.CalibrationConfig(
        probes=ProbePlan(count=args.probes, interval_ms=args.probe_interval_ms), tcp_seconds=args.tcp_seconds
    )
    _check_environment()
    out = calibration.run(profile, backend=args.backend, cfg=cfg, seed=args.seed)
    print((out / "calibration.md").read_text())
    print(f"run directory: {out}")
    return 0


def _image(args) -> int:
    from experiments.run.deploy import worker_image

    image = worker_image(args.base_image, args.no_cache, variant=args.variant)
    state = f"built in {image.build_s:.1f} s" if image.built else "up to date"
    print(f"{image.ref} ({image.size_bytes / 1e6:.0f} MB, FROM {image.base_ref}): {state}")
    return 0


def _clean(args) -> int:
    if args.cluster:
        return _clean_cluster(args.cluster)
    from docker_rt.engine import stop_dockerd
    from docker_rt.host import clean_orphans
    from topology.cleanup import clean, live_runs

    removed = clean_orphans() + clean()
    if not live_runs():  # a live run's containers need their engine
        removed += stop_dockerd() or []
    print("\n".join(removed) if removed else "nothing to clean")
    return 0


def _clean_cluster(address: str) -> int:
    """What dead `--cluster` runs recorded in their ledgers (ray_rt.ledger) undone on the cluster at address."""
    import ray

    from ray_rt.cluster import connect
    from ray_rt.ledger import clean_cluster

    connect(address)
    try:
        lines = clean_cluster(address)
    finally:
        ray.shutdown()
    print("\n".join(lines) if lines else f"nothing to clean on the cluster at {address}")
    return FAILED if any(line.startswith("could not") for line in lines) else OK


class UsageError(ValueError):
    """Bad command-line input."""


class EnvironmentProblem(RuntimeError):
    """This machine cannot do what was asked (not root, a tool missing): exit status ENVIRONMENT."""


def parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests)."""
    ap = argparse.ArgumentParser(
        prog="pddlab",
        description="PDD cross-cluster serving testbed",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("-v", "--verbose", action="store_true")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("profiles", help="list netem profiles").set_defaults(func=_profiles)
    cp = sub.add_parser("check-profile", help="validate profile files")
    cp.add_argument("files", nargs="+")
    cp.set_defaults(func=_check_profile)
    ct = sub.add_parser("check-topology", help="validate topology files; print their sites, hosts and lines")
    ct.add_argument("files", nargs="+")
    ct.add_argument("--pools", default="", help="workers of each pool a file places whole: p=N,rld=N,md=N (1 each)")
    ct.set_defaults(func=_check_topology)
    run = sub.add_parser(
        "run", help="run an experiment", epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    run.add_argument("experiment", nargs="?", default=DEFAULT_EXPERIMENT)
    run.add_argument(
        "--profile", default=None, help=f"profile name or YAML path (default: the spec's, or {DEFAULT_PROFILE})"
    )
    run.add_argument("--backend", default="auto", choices=BACKENDS)
    run.add_argument("--results", default=None, help="parent of the run directory (default: results/)")
    run.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a spec field, e.g. workload.synthetic.sessions=3 (repeatable)",
    )
    run.add_argument(
        "--cluster",
        default=None,
        metavar="ADDRESS",
        help="run on an existing Ray cluster (ray://HEAD:10001, or HEAD:6379 from one of its nodes) instead of the "
        "emulated topology: runtime ray, cluster.address=ADDRESS",
    )
    run.add_argument("--probes", type=int, default=2000, help="UDP probes per direction")
    run.add_argument("--probe-interval-ms", type=float, default=10.0)
    run.add_argument("--tcp-seconds", type=float, default=8.0)
    run.add_argument("--seed", type=int, default=1)
    run.set_defaults(func=_run)
    sw = sub.add_parser(
        "sweep",
        help="run a serving experiment over a grid of values x repeats",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sw.add_argument("experiment", nargs="?", default=DEFAULT_EXPERIMENT)
    sw.add_argument(
        "--over",
        action="append",
        default=[],
        metavar="KEY=V1,V2,...",
        help="an axis: profile, link.FIELD, a_to_b.FIELD, b_to_a.FIELD or a spec field (repeatable: a grid)",
    )
    sw.add_argument("--repeat", type=int, default=1, help="runs per grid point, each with its own workload seed")
    sw.add_argument("--same-seed", action="store_true", help="every repeat on the spec's workload seed")
    sw.add_argument(
        "--no-share-topology",
        dest="share_topology",
        action="store_false",
        help="every point brings its own topology up (default: points that differ only in the link share one)",
    )
    sw.add_argument("--profile", default=None, help="the base profile (default: the spec's)")
    sw.add_argument("--backend", default="auto", choices=BACKENDS)
    sw.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="as for run, on every point")
    sw.add_argument("--results", default=None, help="parent of the sweep directory (default: results/)")
    sw.add_argument("--resume", default=None, metavar="SWEEP_DIR", help="finish an interrupted sweep")
    sw.set_defaults(func=_sweep)
    an = sub.add_parser("analyze", help="recompute summary and plots of a run directory")
    an.add_argument("run_dir")
    an.set_defaults(func=_analyze)
    cmp = sub.add_parser("compare", help="runs (or sweeps) of one spec side by side, later ones over the first")
    cmp.add_argument("dirs", nargs="+", metavar="DIR", help="run directories, or sweep directories (with repeats)")
    cmp.add_argument("--json", default=None, metavar="FILE", help="also write the rows as JSON")
    cmp.set_defaults(func=_compare)
    sv = sub.add_parser("serve", help="serve an OpenAI-compatible API from the testbed until Ctrl-C")
    sv.add_argument("experiment", nargs="?", default=DEFAULT_EXPERIMENT, help="the spec: model, runtime, roles")
    sv.add_argument("--profile", default=None, help="profile name or YAML path (default: the spec's)")
    sv.add_argument("--backend", default="auto", choices=BACKENDS)
    sv.add_argument("--mode", default="pdd", help="the default PDD mode (a request may name its own: `mode`)")
    sv.add_argument("--port", type=int, default=8000, help="on 127.0.0.1 here and on the client host's address")
    sv.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="as for run")
    sv.add_argument(
        "--max-in-flight", type=int, default=64, help="requests served at once; past it HTTP 429 + Retry-After"
    )
    sv.set_defaults(func=_serve)
    net = sub.add_parser("net", help="bring the topology up alone, with Mininet's CLI (like mn)")
    net.add_argument(
        "--profile",
        default=None,
        help=f"profile name or YAML path: the first line's (default: {DEFAULT_PROFILE}; with --topo, each line's own)",
    )
    net.add_argument(
        "--topo", metavar="FILE", help="a topology file, name or path (default: two-clusters); with --custom: NAME"
    )
    net.add_argument(
        "--custom",
        metavar="FILE",
        help="a Mininet topology class, as mn's --custom: a Python file defining topos = {'name': constructor}; "
        "--topo NAME[,ARG,...] picks one (pddlab net only: run, sweep and serve take topology files)",
    )
    net.add_argument("--backend", default="auto", choices=BACKENDS)
    net.add_argument("--cross-hosts", action="store_true", help="add the cross-traffic hosts xa and xb")
    net.add_argument(
        "--exec", action="append", default=[], metavar="LINE", help="run a CLI line, then leave (repeatable)"
    )
    net.set_defaults(func=_net)
    im = sub.add_parser("image", help="build the worker image unless it is up to date (make image)")
    im.add_argument("--base-image", default=None, help="FROM this image (default: $BASE_IMAGE, else Debian's)")
    im.add_argument("--no-cache", action="store_true", help="rebuild every layer")
    im.add_argument(
        "--variant",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: a CUDA build of torch (2.14.1, CUDA 13) for device: cuda pools (~3 GB more; built only when asked)",
    )
    im.set_defaults(func=_image)
    sim = sub.add_parser("simulate", help="simulate a serving experiment (discrete events, docs/simulator.md)")
    sim.add_argument("experiment", nargs="?", default=DEFAULT_EXPERIMENT)
    sim.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a spec field")
    sim.add_argument("--requests", type=int, default=None, help="simulate at most the workload's first N requests")
    sim.add_argument("--seed", type=int, default=None, help="line jitter, P step spread (default: workload.seed)")
    sim.add_argument("--out", default=None, help="the run directory (default: results/<stamp>-<spec>-sim/)")
    sim.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="KEY=V1,V2,...",
        help="simulate over a grid (spec field, link.FIELD, or price.ACCELERATOR); one table row per point and "
        "variant (experiments.sim.sweep)",
    )
    sim.add_argument(
        "--sla", type=float, default=0.9, help="with --sweep: the share of requests meeting the SLO that meets the SLA"
    )
    sim.set_defaults(func=_simulate)
    sub.add_parser("experiments", help="list the experiments").set_defaults(func=_experiments)
    cl = sub.add_parser("clean", help="remove leftovers of crashed runs")
    cl.add_argument(
        "--cluster",
        metavar="ADDRESS",
        help="instead: undo on that Ray cluster what dead `run --cluster` runs left (netem, work directories)",
    )
    cl.set_defaults(func=_clean)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point: returns the process exit status."""
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:  # Mininet's log module must create its logger (a MininetLogger) before anyone touches "mininet" ...
        import mininet.log  # noqa: F401
    except ImportError:
        pass  # preflight says how to install it, where it is needed
    logging.setLoggerClass(logging.Logger)  # ... and must not make every later logger a MininetLogger
    logging.getLogger("mininet").setLevel(logging.ERROR)
    from docker_rt import DockerError
    from topology.net import TestbedError
    from topology.shaping import ShapingError

    from ray_rt import RayRuntimeError

    try:
        return args.func(args)
    except (ProfileError, TopologyError, UsageError, SpecError, SweepError, TraceError) as exc:
        return _error(exc, BAD_INPUT)
    except (EnvironmentProblem, DockerError, RayRuntimeError, ShapingError) as exc:  # ShapingError: no netem
        return _error(exc, ENVIRONMENT)
    except TestbedError as exc:  # the topology failed once the run had started (preflight's checks came first)
        return _error(exc, FAILED)
    except KeyboardInterrupt:
        print("pddlab: interrupted; everything the run made was torn down", file=sys.stderr)
        return INTERRUPTED


def _error(exc: Exception, status: int) -> int:
    """One line on stderr (a Docker build's log tail stays in the log the message names); status returned."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    print(f"pddlab: error: {lines[0]}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
