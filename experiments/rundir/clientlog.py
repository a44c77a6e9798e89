"""client.jsonl, typed: the client's record of each request — its one layout, writer and reader.

Responsible for: `ClientRecord` (one request as the client saw it: what it sent, every token with
its receipt time, the router's done message or the error), `new_record` and `add_event` (the two
writers, experiments.run.loadgen and experiments.serve.front_door, build records through them), `line` (the
one way a record becomes a line of client.jsonl) and `read` (validated: a missing or wrong field is an
error naming the file, the line and the field).
Not responsible for: sending requests (experiments.run.loadgen, experiments.serve.front_door) or joining the
records with the roles' events (experiments.analysis.records).

A line is one JSON object, appended as its request ends; a token is the row
[index, token, worker, t_recv_ns, t_ns] (TokenRow). Times are time.monotonic_ns(), the clock the
roles log with. Older logs: `mode` absent (it was the variant's own), `prompt`, `prompt_sha1`, `t0_ns`
absent (read as None), `issued` absent (every request was sent).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, model_validator

from experiments.rundir import files as rundir

log = logging.getLogger(__name__)


class ClientLogError(rundir.RecordError):
    """A client.jsonl line is not a ClientRecord; the message names the file, the line and the field."""


class TokenRow(NamedTuple):
    """One token of the reply, a positional row on disk."""

    index: int  # its place in the reply (0: P's first token)
    token: int  # the token id
    worker: str  # who produced it (p1, rld1, md1, ...)
    t_recv_ns: int  # the client's receipt
    t_ns: int  # the worker's send


class Done(BaseModel):
    """The router's last message of a request (pdd.proto GenerateEvent.done)."""

    route: str  # a workers.roles.routing.Route value
    finish_reason: str
    duplicates: int
    md_cached_tokens: int
    notes: list[str]


class ClientRecord(BaseModel):
    """One request as the client saw it."""

    model_config = ConfigDict(validate_assignment=True, extra="ignore")

    request_id: str
    router_id: str  # the id the roles log it under: <variant>.<request_id>
    variant: str
    mode: str  # the serving mode sent (= the variant, unless the spec's variant_defs names another)
    session: str
    turn: int
    kind: str  # the workload's kind (warmup, agent, fresh, singular, trace, ...)
    max_tokens: int
    prompt_tokens: int
    prompt: list[int] | None = None  # the token ids sent
    prompt_sha1: str | None = None
    prompt_source: str = ""  # workload | previous | reference (a failed turn's reply from colocated)
    t0_ns: int | None = None  # the variant's t0 (the load generator's `start t0_ns=` line)
    t_send_ns: int
    t_done_ns: int | None = None  # None: it never ended (the writer died first)
    tokens: list[TokenRow]  # in the order received
    done: Done | None = None  # None: the router's stream ended without it (an error)
    error: str | None  # None: it completed
    issued: bool = True  # False: never sent (past the issue deadline, or the run stopped first)
    handoff: str | None = None  # the handoff mode it asked for (None: the deployment's; older logs)

    @model_validator(mode="before")
    @classmethod
    def _older_mode(cls, data: Any) -> Any:
        """Logs before the serving mode was recorded: the variant was the mode."""
        if isinstance(data, dict) and "mode" not in data and "variant" in data:
            data = {**data, "mode": data["variant"]}
        return data

    def reply(self) -> list[int]:
        """The reply's token ids in index order."""
        return [t.token for t in sorted(self.tokens)]


def new_record(
    request_id: str,
    variant: str,
    mode: str,
    session: str,
    turn: int,
    kind: str,
    max_tokens: int,
    prompt: list[int] | tuple[int, ...] | None,
    t0_ns: int | None,
    router_id: str | None = None,
) -> ClientRecord:
    """A request's record as it is sent (now): no tokens yet, no error. router_id: default <variant>.<id>."""
    ids = list(prompt or ())
    return ClientRecord(
        request_id=request_id,
        router_id=router_id or f"{variant}.{request_id}",
        variant=variant,
        mode=mode,
        session=session,
        turn=turn,
        kind=kind,
        max_tokens=max_tokens,
        prompt_tokens=len(ids),
        prompt=ids,
        prompt_sha1=hashlib.sha1(json.dumps(ids).encode()).hexdigest()[:16],
        t0_ns=t0_ns,
        t_send_ns=time.monotonic_ns(),
        tokens=[],
        error=None,
    )


def add_event(rec: ClientRecord, ev) -> None:
    """One GenerateEvent of the router's stream into rec: a token row (received now) or the done message."""
    if ev.WhichOneof("kind") == "token":
        t = ev.token
        rec.tokens.append(TokenRow(t.index, t.token, t.worker, time.monotonic_ns(), t.t_ns))
    else:
        d = ev.done
        rec.done = Done(
            route=d.route,
            finish_reason=d.finish_reason,
            duplicates=d.duplicates,
            md_cached_tokens=d.md_cached_tokens,
            notes=list(d.notes),
        )


def line(rec: ClientRecord) -> str:
    """rec as one line of client.jsonl (with its newline)."""
    return rec.model_dump_json() + "\n"


def read(path: Path) -> list[ClientRecord]:
    """Every record of a client.jsonl ([] where there is none). A torn last line (its writer killed
    mid-write) is left out with a warning; any other bad line is a ClientLogError."""
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    out = []
    for n, text in enumerate(lines, 1):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            if n == len(lines):
                log.warning("%s:%d: a torn last line left out (%s)", path, n, err)
                continue
            raise ClientLogError(f"{path}:{n}: not JSON ({err})") from None
        out.append(rundir.parse(ClientRecord, data, f"{path}:{n}", ClientLogError))
    return out
