"""Cut the repo's Mooncake slice from the public trace: conversations that reuse a prefix, lines unchanged.

    python3 scripts/mooncake_slice.py ../shared/traces/mooncake/conversation_trace.jsonl \
        experiments/traces/mooncake-conversation-slice.jsonl

A slice of consecutive lines would hold almost no reuse (a conversation's turns lie minutes apart), so
this keeps, from the first --scan lines, the first --children requests whose leading hash ids repeat at
least --min-shared ids of an earlier request, together with that earlier request (the one sharing the
most), in trace order, each line byte for byte as in the trace.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def shared(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def cut(lines: list[str], scan: int, children: int, min_shared: int) -> list[str]:
    ids = [json.loads(line)["hash_ids"] for line in lines[:scan]]
    keep: set[int] = set()
    found = 0
    for i in range(len(ids)):
        best, parent = max(((shared(ids[i], ids[j]), j) for j in range(i)), default=(0, -1))
        if best >= min_shared:
            keep.update((i, parent))
            found += 1
            if found == children:
                break
    return [lines[i] for i in sorted(keep)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--scan", type=int, default=400)
    ap.add_argument("--children", type=int, default=20)
    ap.add_argument("--min-shared", type=int, default=4)
    args = ap.parse_args()
    lines = args.trace.read_text().splitlines()
    out = cut(lines, args.scan, args.children, args.min_shared)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(line + "\n" for line in out))
    print(f"{len(out)} of the first {args.scan} lines -> {args.out}")


if __name__ == "__main__":
    main()
