"""The load figure of `pddlab serve`: streamed chat requests at rising concurrency, each one accounted for.

    python benchmarks/bench_serve_load.py                      # pdd-vs-baselines, pdd, steps 1,4,16,48,128
    python benchmarks/bench_serve_load.py --steps 1,4 --requests-per-step 8 --out load.json

Starts `pddlab serve EXPERIMENT --mode MODE --port PORT --set runtime=process` itself (root: the topology),
waits for /v1/models, drives it with the `openai` package (AsyncOpenAI, streamed chat completions, no
retries) in closed loop at each concurrency, then stops it with SIGTERM (SIGKILL only past --stop-grace-s)
and checks that its topology left nothing. It speaks only the HTTP API (OpenAI's shape), never the
front door's classes. Per step it prints:

- admitted: a 200 stream that ended normally with content and every token asked for;
- refused: HTTP 429 or 503 before the stream (the client sees the status, as an OpenAI client expects);
- failed: anything else (another status, a stream with no content or short of max_tokens, an error event
  mid-stream, a connection error or timeout);
- unaccounted: requests sent that are none of those (must be 0);
- TTFT and TPOT p50/p99 of the admitted (TTFT: send to the first non-empty content; TPOT: first to last
  content over the server's completion tokens - 1), goodput (admitted requests meeting the spec's SLO,
  experiments.analysis.metrics.meets_slo, per second of the step), and the peak RSS of the front door and of
  the roles (VmRSS of the serve process's descendants, sampled every 0.5 s).

One prompt per request (random words, distinct, so no prefix is shared), sized with the served model's
tokenizer so the templated prompt is --prompt-tokens long (616, as in issue 28's aiperf run).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from experiments.analysis.metrics import meets_slo, percentile

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[1]
DEFAULT_STEPS = (1, 4, 16, 48, 128)
# the front door's "not now": past its bound, or the roles' RESOURCE_EXHAUSTED / UNAVAILABLE
REFUSED_STATUSES = (429, 503)
RSS_PERIOD_S = 0.5
ADMITTED, REFUSED, FAILED = "admitted", "refused", "failed"


# ------------------------------------------------------------------ outcomes and their statistics


@dataclass
class Outcome:
    """What became of one request: kind (admitted/refused/failed), why (failed/refused), timings (ms)."""

    kind: str
    reason: str = ""
    status: int | None = None  # the HTTP status, where one came back
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    prompt_tokens: int | None = None  # the server's count (usage)
    output_tokens: int = 0

    @property
    def ok(self) -> bool:  # metrics.meets_slo's question
        return self.kind == ADMITTED


def refused_or_failed(status: int, message: str = "") -> Outcome:
    """An HTTP error before the stream: 429/503 is a refusal, any other status a failure."""
    kind = REFUSED if status in REFUSED_STATUSES else FAILED
    return Outcome(kind, f"HTTP {status}: {message}"[:200], status)


def stream_outcome(
    t_send: float, content_times: list[float], t_end: float, completion_tokens: int | None, max_tokens: int
) -> Outcome:
    """A 200 stream that ended without an error (times in s, perf_counter): admitted only with content and every
    token asked for (the server's usage count when it sent one, else the content chunks')."""
    n = completion_tokens if completion_tokens is not None else len(content_times)
    if not content_times:
        return Outcome(FAILED, "a 200 stream with no content", 200, e2e_ms=(t_end - t_send) * 1e3)
    first, last = content_times[0], content_times[-1]
    out = Outcome(
        ADMITTED,
        status=200,
        ttft_ms=(first - t_send) * 1e3,
        tpot_ms=(last - first) * 1e3 / (n - 1) if n > 1 else None,
        e2e_ms=(t_end - t_send) * 1e3,
        output_tokens=n,
    )
    if n < max_tokens:
        return dataclasses.replace(out, kind=FAILED, reason=f"short: {n} of {max_tokens} tokens")
    return out


@dataclass
class Step:
    """One concurrency step: the requests sent, what became of each, and how long it took."""

    concurrency: int
    sent: int
    outcomes: list[Outcome]
    duration_s: float
    rss_mib: dict[str, float] = field(default_factory=dict)  # peak VmRSS per process name


def _pct(xs: list[float], p: float) -> float | None:
    return percentile(xs, p) if xs else None


def summarize(step: Step, slo) -> dict:
    """The step's row: counts (unaccounted = sent - the three kinds), latency percentiles of the admitted,
    goodput under slo (requests/s), failure reasons, peak RSS."""
    kinds = {k: [o for o in step.outcomes if o.kind == k] for k in (ADMITTED, REFUSED, FAILED)}
    ok = kinds[ADMITTED]
    ttft = [o.ttft_ms for o in ok if o.ttft_ms is not None]
    tpot = [o.tpot_ms for o in ok if o.tpot_ms is not None]
    good = sum(meets_slo(o, slo) for o in ok)
    reasons: dict[str, int] = {}
    for o in kinds[FAILED] + kinds[REFUSED]:
        key = re.sub(r"\d+ of", "N of", o.reason.split(":", 1)[0] if o.status else o.reason)[:80]
        reasons[key] = reasons.get(key, 0) + 1
    roles = {k: v for k, v in step.rss_mib.items() if k not in ("front-door", "serve", "other")}
    return {
        "concurrency": step.concurrency,
        "sent": step.sent,
        "admitted": len(ok),
        "refused": len(kinds[REFUSED]),
        "failed": len(kinds[FAILED]),
        "unaccounted": step.sent - sum(len(v) for v in kinds.values()),
        "duration_s": step.duration_s,
        "ttft_ms": {"p50": _pct(ttft, 50), "p99": _pct(ttft, 99)},
        "tpot_ms": {"p50": _pct(tpot, 50), "p99": _pct(tpot, 99)},
        "meeting_slo": good,
        "goodput_rps": good / step.duration_s if step.duration_s > 0 else None,
        "prompt_tokens_mean": _mean([o.prompt_tokens for o in ok if o.prompt_tokens is not None]),
        "reasons": reasons,
        "rss_mib": step.rss_mib,
        "front_door_rss_mib": step.rss_mib.get("front-door"),
        "roles_rss_mib": sum(roles.values()) if roles else None,
    }


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _num(x: float | None, fmt: str = ".0f") -> str:
    return "-" if x is None else format(x, fmt)


def table(rows: list[dict]) -> str:
    """The markdown table, one line per step."""
    head = (
        "| concurrency | sent | admitted | refused | failed | unaccounted | TTFT p50 / p99 ms | TPOT p50 / p99 ms "
        "| goodput req/s (met SLO) | front door RSS MiB | roles RSS MiB |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        lines.append(
            f"| {r['concurrency']} | {r['sent']} | {r['admitted']} | {r['refused']} | {r['failed']} "
            f"| {r['unaccounted']} | {_num(r['ttft_ms']['p50'])} / {_num(r['ttft_ms']['p99'])} "
            f"| {_num(r['tpot_ms']['p50'], '.1f')} / {_num(r['tpot_ms']['p99'], '.1f')} "
            f"| {_num(r['goodput_rps'], '.2f')} ({r['meeting_slo']}) "
            f"| {_num(r['front_door_rss_mib'])} | {_num(r['roles_rss_mib'])} |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------ prompts


def chat_text(content: str) -> str:
    """The served chat template for one user message (docs/serve.md: one `<|role|>` line per message, then the
    assistant's turn); used only to size prompts, the server's usage count is what the table reports."""
    return f"<|user|>\n{content}\n<|assistant|>\n"


def make_prompt(count, target_tokens: int, rng: random.Random) -> str:
    """Random words whose templated prompt is target_tokens long by count(text) (within a token or two when the
    tokenizer's merges make it unreachable)."""
    words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))) for _ in range(target_tokens)]
    lo, hi = 0, len(words)
    while lo < hi:  # the most words that fit
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if count(chat_text(" ".join(words[:mid]))) <= target_tokens else (lo, mid - 1)
    content = " ".join(words[:lo])
    for ch in rng.choices("abcdefghijklmnopqrstuvwxyz", k=64):
        if count(chat_text(content)) >= target_tokens:
            break
        if count(chat_text(content + ch)) <= target_tokens:
            content += ch
    return content


def make_prompts(tokenizer_json: Path, n: int, target_tokens: int, seed: int) -> list[str]:
    """n distinct prompts (no shared prefix past the template), sized with the served model's tokenizer."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    rng = random.Random(seed)
    return [make_prompt(lambda t: len(tok.encode(t).ids), target_tokens, rng) for _ in range(n)]


# ------------------------------------------------------------------ the client


async def one_request(client, model: str, prompt: str, max_tokens: int) -> Outcome:
    """One streamed chat completion, classified (never raises but for cancellation)."""
    import openai

    t_send = time.perf_counter()
    content_times: list[float] = []
    usage = None
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
        )
        async for chunk in stream:
            usage = chunk.usage or usage
            if any(c.delta is not None and c.delta.content for c in chunk.choices):
                content_times.append(time.perf_counter())
    except openai.APIStatusError as err:  # an HTTP status before the stream
        return refused_or_failed(err.status_code, err.message)
    except Exception as err:  # an error event mid-stream (openai.APIError), connection lost, timeout
        return Outcome(FAILED, f"{type(err).__name__}: {err}"[:200], 200 if content_times else None)
    out = stream_outcome(
        t_send, content_times, time.perf_counter(), usage.completion_tokens if usage else None, max_tokens
    )
    out.prompt_tokens = usage.prompt_tokens if usage else None
    return out


async def run_step(client, model: str, prompts: list[str], concurrency: int, max_tokens: int, rss) -> Step:
    """prompts sent closed-loop by `concurrency` workers (each sends its next one when the last ends); rss():
    the peak RSS per process name since the last call."""
    todo = list(reversed(prompts))
    outcomes: list[Outcome] = []
    sent = 0

    async def worker() -> None:
        nonlocal sent
        while todo:
            prompt = todo.pop()
            sent += 1
            outcomes.append(await one_request(client, model, prompt, max_tokens))

    rss()  # a fresh peak for this step
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)), return_exceptions=True)
    return Step(concurrency, sent, outcomes, time.perf_counter() - t0, rss())


# ------------------------------------------------------------------ the serve session's processes


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    return kids


def descendants(root: int) -> list[int]:
    """root and every process under it (the topology's host shells and what runs in them are its children)."""
    kids, out, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += kids.get(pid, [])
    return out


def recorded_pids(owner: int, state_dir: Path) -> list[int]:
    """The PIDs the serve session's testbed recorded (topology.cleanup's state file testbed-<owner>.json)."""
    try:
        state = json.loads((state_dir / f"testbed-{owner}.json").read_text())
    except (OSError, ValueError):
        return []
    return [e["pid"] for e in state.get("procs", [])]


def process_name(argv: list[str], pid: int, serve_pid: int) -> str:
    """front-door, a role's worker name (its --worker), serve (the session itself) or other."""
    if pid == serve_pid:
        return "serve"
    if "experiments.serve.front_door" in argv:
        return "front-door"
    if "--worker" in argv[:-1] and any(a.startswith("workers.roles.") for a in argv):
        return argv[argv.index("--worker") + 1]
    return "other"


def rss_kib(pid: int) -> int | None:
    """VmRSS (KiB) of pid; None when it is gone (or a kernel thread)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    m = re.search(r"^VmRSS:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) if m else None


def rss_by_name(serve_pid: int, state_dir: Path) -> dict[str, float]:
    """MiB per process name now (processes of one name summed)."""
    out: dict[str, float] = {}
    for pid in set(descendants(serve_pid)) | set(recorded_pids(serve_pid, state_dir)):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        kib = rss_kib(pid)
        if kib is not None:
            name = process_name(argv, pid, serve_pid)
            out[name] = out.get(name, 0.0) + kib / 1024
    return out


class RssSampler:
    """Samples rss_by_name every RSS_PERIOD_S on a thread; peak() returns the peak per name since the last call."""

    def __init__(self, serve_pid: int, state_dir: Path):
        import threading

        self.serve_pid, self.state_dir = serve_pid, state_dir
        self._peak: dict[str, float] = {}
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)

    def _sample(self) -> None:
        now = rss_by_name(self.serve_pid, self.state_dir)
        with self._lock:
            for name, mib in now.items():
                self._peak[name] = max(self._peak.get(name, 0.0), mib)

    def _run(self) -> None:
        while not self._stop.wait(RSS_PERIOD_S):
            self._sample()

    def peak(self) -> dict[str, float]:
        self._sample()
        with self._lock:
            peak, self._peak = self._peak, {}
        return {k: round(v, 1) for k, v in sorted(peak.items())}


# ------------------------------------------------------------------ the serve session


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def served_model(port: int) -> str | None:
    """The model /v1/models names, or None while the API does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as resp:
            return json.loads(resp.read())["data"][0]["id"]
    except (OSError, ValueError, KeyError, IndexError):
        return None


class Serve:
    """`pddlab serve` as a subprocess: up until /v1/models answers, then SIGTERM by its PID (SIGKILL past
    grace_s) and a check that its processes and state file are gone (`make clean` if not)."""

    def __init__(self, argv: list[str], port: int, log_path: Path, state_dir: Path, ready_s: float, grace_s: float):
        self.argv, self.port, self.log_path, self.state_dir = argv, port, log_path, state_dir
        self.ready_s, self.grace_s = ready_s, grace_s
        self.proc: subprocess.Popen | None = None
        self.seen: dict[int, int | None] = {}  # pid -> start time of every process the session had
        self.exit_code: int | None = None
        self.leftovers: list[str] = []

    def start(self) -> str:
        """Start it; the served model's name once the API answers (RuntimeError with the log's tail if not)."""
        log.info("starting %s", " ".join(self.argv))
        with open(self.log_path, "w") as out:
            self.proc = subprocess.Popen(self.argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.ready_s
        while (model := served_model(self.port)) is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_path.read_text()[-3000:]
                raise RuntimeError(f"pddlab serve not ready (exit {self.proc.poll()}); {self.log_path}:\n{tail}")
            time.sleep(1)
        self.remember()
        return model

    def remember(self) -> None:
        """Note the session's processes now, to check after it exits that none is left."""
        from topology.cleanup import start_time

        for pid in set(descendants(self.proc.pid)) | set(recorded_pids(self.proc.pid, self.state_dir)):
            self.seen.setdefault(pid, start_time(pid))

    def session_dir(self) -> Path | None:
        m = re.search(r"; session (\S+);", self.log_path.read_text())
        return Path(m.group(1)) if m else None

    def stop(self) -> None:
        """SIGTERM, wait grace_s, SIGKILL only then; afterwards nothing of it may be left."""
        from topology.cleanup import is_same_process

        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.remember()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.exit_code = self.proc.wait(self.grace_s)
            except subprocess.TimeoutExpired:
                log.warning("pddlab serve (pid %d) still up %g s after SIGTERM: SIGKILL", self.proc.pid, self.grace_s)
                self.proc.kill()
                self.exit_code = self.proc.wait(30)
        self.exit_code = self.proc.returncode
        state = self.state_dir / f"testbed-{self.proc.pid}.json"
        alive = [p for p, t in self.seen.items() if p != self.proc.pid and is_same_process(p, t)]
        if alive or state.exists():
            self.leftovers = [f"pid {p}" for p in alive] + ([str(state)] if state.exists() else [])
            log.warning("left after serve exited: %s; running make clean", ", ".join(self.leftovers))
            subprocess.run(["make", "clean"], cwd=REPO, check=False)


def server_records(session: Path | None, mode: str) -> int | None:
    """Requests the front door recorded (client.jsonl lines), after the session ended."""
    path = session / "variants" / mode / "client.jsonl" if session else None
    if path is None or not path.exists():
        return None
    return sum(1 for line in path.read_text().splitlines() if line.strip())


# ------------------------------------------------------------------ the command line


def parse_steps(text: str) -> list[int]:
    try:
        steps = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--steps: integers separated by commas, got {text!r}") from None
    if not steps or any(s < 1 for s in steps):
        raise argparse.ArgumentTypeError(f"--steps: concurrencies >= 1, got {text!r}")
    return steps


def requests_for(concurrency: int, per_step: int | None) -> int:
    """A step's request count: --requests-per-step, else 4 per concurrent slot (at most 192, aiperf's run)."""
    return per_step if per_step else min(4 * concurrency, 192)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("experiment", nargs="?", default="pdd-vs-baselines", help="the spec `pddlab serve` serves")
    p.add_argument("--mode", default="pdd")
    p.add_argument("--steps", type=parse_steps, default=list(DEFAULT_STEPS), help="concurrencies, e.g. 1,4,16")
    p.add_argument("--requests-per-step", type=int, default=None, help="default: 4 x concurrency, at most 192")
    p.add_argument("--prompt-tokens", type=int, default=616, help="the templated prompt's tokens")
    p.add_argument("--output-tokens", type=int, default=24, help="max_tokens of each request")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="as for serve (runtime=process)")
    p.add_argument("--serve-arg", action="append", default=[], help="more for serve's command line, e.g. --profile=x")
    p.add_argument("--port", type=int, default=None, help="default: a free one")
    p.add_argument("--warmup", type=int, default=1, help="requests before the first step (not counted)")
    p.add_argument("--request-timeout-s", type=float, default=600.0)
    p.add_argument("--ready-s", type=float, default=900.0, help="for /v1/models to answer")
    p.add_argument("--stop-grace-s", type=float, default=600.0, help="after SIGTERM (serve analyses its session)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=REPO / "results" / "bench-serve-load.json")
    return p


async def drive(args, port: int, model: str, prompts: list[str], sampler: RssSampler) -> list[Step]:
    import openai

    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=args.request_timeout_s
    )
    async with client:
        for _ in range(args.warmup):
            await one_request(client, model, prompts.pop(), args.output_tokens)
        steps = []
        for c in args.steps:
            n = requests_for(c, args.requests_per_step)
            batch, prompts[:] = prompts[:n], prompts[n:]
            steps.append(await run_step(client, model, batch, c, args.output_tokens, sampler.peak))
            print(f"concurrency {c}: {len(steps[-1].outcomes)} of {n} done in {steps[-1].duration_s:.1f} s", flush=True)
        return steps


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
    args = parser().parse_args(argv)
    if args.requests_per_step is not None and args.requests_per_step < 1:
        parser().error("--requests-per-step must be >= 1")
    if os.geteuid() != 0:
        print("bench_serve_load: needs root (`pddlab serve` brings up the topology)", file=sys.stderr)
        return 3
    from experiments.serve.session import tokenizer_dir
    from experiments.spec.experiment import load_spec
    from topology.cleanup import STATE_DIR, live_runs

    if live := live_runs():
        print(f"bench_serve_load: a topology is already up (run {live}); one at a time", file=sys.stderr)
        return 3
    sets = args.set if any(s.startswith("runtime=") for s in args.set) else ["runtime=process", *args.set]
    spec = load_spec(args.experiment, sets)
    total = args.warmup + sum(requests_for(c, args.requests_per_step) for c in args.steps)
    prompts = make_prompts(tokenizer_dir(spec.model) / "tokenizer.json", total, args.prompt_tokens, args.seed)
    port = args.port or free_port()
    argv = [sys.executable, "-m", "experiments.cli", "serve", args.experiment, "--mode", args.mode]
    argv += ["--port", str(port), *(f"--set={s}" for s in sets), *args.serve_arg]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    serve = Serve(argv, port, args.out.with_suffix(".serve.log"), STATE_DIR, args.ready_s, args.stop_grace_s)
    t0 = time.monotonic()
    try:
        try:
            model = serve.start()
        except RuntimeError as err:
            print(f"bench_serve_load: {err}", file=sys.stderr)
            return 1
        print(f"serving {model} on port {port} after {time.monotonic() - t0:.0f} s; session {serve.session_dir()}")
        with RssSampler(serve.proc.pid, STATE_DIR) as sampler:
            steps = asyncio.run(drive(args, port, model, prompts, sampler))
    finally:
        serve.stop()
    return report(args, spec, steps, serve, total, time.monotonic() - t0)


def report(args, spec, steps: list[Step], serve: Serve, total: int, wall_s: float) -> int:
    rows = [summarize(s, spec.slo) for s in steps]
    recorded = server_records(serve.session_dir(), args.mode)
    slo = dataclasses.asdict(spec.slo)
    print(f"\n{args.experiment}, {args.mode} mode, {spec.model} model, {spec.runtime} runtime; {os.cpu_count()} CPUs")
    print(f"{args.prompt_tokens}-token prompts, {args.output_tokens} output tokens; goodput SLO {slo}\n")
    print(table(rows))
    for r in rows:
        if r["reasons"]:
            print(f"concurrency {r['concurrency']}: " + "; ".join(f"{k} x{n}" for k, n in r["reasons"].items()))
    print(f"\nserve exited {serve.exit_code}; the front door recorded {recorded} of {total} requests sent")
    print(f"left behind: {', '.join(serve.leftovers) or 'nothing'}; {wall_s:.0f} s in all")
    result = {
        "experiment": args.experiment,
        "mode": args.mode,
        "model": spec.model,
        "runtime": spec.runtime,
        "cpus": os.cpu_count(),
        "prompt_tokens": args.prompt_tokens,
        "output_tokens": args.output_tokens,
        "slo": slo,
        "steps": rows,
        "serve": {
            "exit_code": serve.exit_code,
            "session": str(serve.session_dir()),
            "sent_total": total,
            "server_records": recorded,
            "leftovers": serve.leftovers,
        },
        "wall_s": wall_s,
    }
    args.out.write_text(json.dumps(result, indent=2))
    print(f"JSON: {args.out}")
    ok = all(r["unaccounted"] == 0 for r in rows) and serve.exit_code == 0 and not serve.leftovers
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
