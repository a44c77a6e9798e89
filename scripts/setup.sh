#!/usr/bin/env bash
# Installs what pddlab needs, idempotently: Debian packages, then the project
# venv (Debian's python3, so Mininet's library is visible; torch pinned to the
# CPU wheel in /opt/wheels). Nothing else is fetched at run time.
set -euo pipefail
cd "$(dirname "$0")/.."

DEBS=(mininet bridge-utils net-tools iproute2 iputils-ping iperf3 tcpdump tshark ethtool
      iptables procps kmod cpio xz-utils zstd qemu-system-x86 busybox-static
      python3-venv python3-dev)

missing=()
for pkg in "${DEBS[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || { echo "setup: need root to install ${missing[*]}" >&2; exit 1; }
  echo "setup: installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=/usr/bin/python3
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv from $PY (with Debian's site-packages for Mininet)"
  "$PY" -m venv --system-site-packages .venv
fi
stamp=.venv/.pddlab-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: installing the project into .venv"
  .venv/bin/pip install -q --disable-pip-version-check --find-links /opt/wheels -e '.[test,host,ray,sim]'
  touch "$stamp"
fi
.venv/bin/python -c "import mininet.net, torch, yaml" || { echo "setup: venv is incomplete" >&2; exit 1; }
# The simulator's hot modules compiled by Cython (experiments/sim/compiled.py), again whenever a source changed.
# Optional: a build that fails leaves them as Python (pddlab simulate the same, ~1.5x slower), and setup goes on.
SIM_BUILD=(.venv/bin/python -c 'import sys; from experiments.sim import compiled; sys.exit(compiled.main(sys.argv[1:]))')
if ! "${SIM_BUILD[@]}" check >/dev/null 2>&1; then
  echo "setup: compiling the simulator's hot modules (Cython, ~30 s)"
  if ! "${SIM_BUILD[@]}" build >.venv/sim-compiled.log 2>&1; then
    tail -n 5 .venv/sim-compiled.log >&2
    echo "setup: the simulator's compiled build failed (.venv/sim-compiled.log): it runs as pure Python" >&2
  fi
fi
# Docker is not started here: what needs it (a docker-runtime run, `make image`, the docker tier) starts it
# itself (`make docker` does it alone), so `make profiles` or `make analyze` leaves the machine as it was.
echo "setup: ok"
