"""Generate pdd_pb2.py, pdd_pb2_grpc.py and pdd_pb2.pyi from pdd.proto (one command, as sglang's compile_proto.py).

Responsible for: running grpc_tools.protoc with the repo root as include path,
so the stubs import each other as `workers.proto.pdd_pb2`; `ensure_stubs()`
regenerates only when the stubs are missing or made from another .proto (for
`make setup` on a fresh clone).
Not responsible for: the services themselves (workers/roles/).

Usage: python -m workers.proto.compile [--check]
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import sys
from pathlib import Path

log = logging.getLogger(__name__)

PROTO_DIR = Path(__file__).resolve().parent
REPO_ROOT = PROTO_DIR.parent.parent
PROTO = PROTO_DIR / "pdd.proto"
OUTPUTS = [PROTO_DIR / n for n in ("pdd_pb2.py", "pdd_pb2_grpc.py", "pdd_pb2.pyi")]
STAMP = PROTO_DIR / "pdd.proto.sha256"  # the .proto the stubs were made from (mtimes do not survive git)


def protoc_args() -> list[str]:
    """The protoc command line (pure: no side effects)."""
    rel = PROTO.relative_to(REPO_ROOT)
    return [
        "grpc_tools.protoc",
        f"-I{REPO_ROOT}",
        f"--python_out={REPO_ROOT}",
        f"--pyi_out={REPO_ROOT}",
        f"--grpc_python_out={REPO_ROOT}",
        str(rel),
    ]


def compile_stubs() -> None:
    """Run protoc; raise RuntimeError if it fails."""
    from grpc_tools import protoc  # build-time dependency only

    args = protoc_args()
    log.info("running %s", " ".join(args))
    rc = protoc.main(args)
    if rc != 0:
        raise RuntimeError(f"protoc failed with exit code {rc}: {' '.join(args)}")
    STAMP.write_text(proto_sha256() + "\n")


def proto_sha256() -> str:
    return hashlib.sha256(PROTO.read_bytes()).hexdigest()


def stubs_stale() -> bool:
    """True when a stub is missing or was generated from another version of pdd.proto."""
    if any(not p.exists() for p in OUTPUTS) or not STAMP.exists():
        return True
    return STAMP.read_text().strip() != proto_sha256()


def ensure_stubs() -> bool:
    """Generate the stubs if missing or stale; return True if it ran protoc."""
    if not stubs_stale():
        return False
    compile_stubs()
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the stubs are stale instead of generating")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.check:
        return 1 if stubs_stale() else 0
    compile_stubs()
    return 0


if __name__ == "__main__":
    sys.exit(main())
