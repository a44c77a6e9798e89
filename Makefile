# pddlab: the single entry point. CI runs `make test` (via .ci/run). `make help` lists the targets.
PY      := .venv/bin/python
PDDLAB  := .venv/bin/pddlab
EXP     ?= pdd-vs-baselines
SET     ?=
RUN     ?=
PROFILE ?=
BACKEND ?= auto
PYTEST  := $(PY) -m pytest -q -rs --durations=10 --durations-min=20
# --profile only when PROFILE is given: otherwise the spec's own `profile:` holds.
PROFILE_ARG = $(if $(PROFILE),--profile $(PROFILE))

.PHONY: help setup docker image lint test test-unit test-roles test-ray test-emulation test-extended test-faults test-docker vm-test vm-test-wire \
	bench sim-compiled run-experiment sweep analyze compare docs-figures clean profiles net serve

help: ## this list
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  make %-15s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

setup: ## install what pddlab needs (Debian packages, .venv); idempotent, starts nothing
	@bash scripts/setup.sh

docker: setup ## the Docker engine: installed, and dockerd started when nothing answers (runs that need it do this)
	@$(PY) -m docker_rt.engine ensure

# `clean` first: a run that crashed (or a machine restarted mid-run) leaves state the topology tiers refuse.
test: setup clean lint test-unit test-roles test-ray test-emulation test-faults test-docker vm-test ## every tier, as CI runs it

sim-compiled: setup ## the simulator's hot modules compiled again (Cython; make setup does it when a source changed)
	$(PY) -c 'import sys; from experiments.sim import compiled; sys.exit(compiled.main(sys.argv[1:]))' build

lint: setup ## ruff check and format check (generated gRPC stubs excluded), and docs/architecture.md's modules section
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/python scripts/architecture.py --check

test-unit: setup ## no-root unit tests of pure logic
	$(PYTEST) tests/unit tests/experiments tests/vm/test_vm_builders.py

test-roles: setup ## the PDD roles as real processes on loopback (no root)
	$(PYTEST) tests/roles tests/e2e

# The roles under Ray on a two-node Ray cluster on loopback (no root, no topology), and `pddlab run --cluster`
# against it. (The Ray smoke experiment in the topology, a Ray node per host, is in tests/emulation.)
test-ray: setup ## the roles under Ray on a two-node Ray cluster on loopback
	$(PYTEST) tests/ray

# The worker image, built from a local debootstrap base (no registry); BASE_IMAGE=... overrides.
# VARIANT=cuda: the same image with a CUDA build of torch (2.14.1), for `device: cuda` pools (built only when asked).
VARIANT ?= cpu
image: docker ## the worker image (VARIANT=cpu|cuda), built from a local debootstrap base
	$(PDDLAB) image --variant $(VARIANT)

test-docker: setup image ## Docker hosts in the topology (root)
	$(PYTEST) tests/docker

test-emulation: setup ## the topology, fidelity and experiments end to end (root)
	$(PYTEST) -m "not extended" tests/emulation

test-extended: setup ## what make test leaves out for CI's time: fidelity of wan-cross-country and wan-flaky (root)
	$(PYTEST) -m extended tests/emulation

test-faults: setup ## faults under load: every component SIGKILLed mid-run, the WAN down, heavy loss (root)
	$(PYTEST) tests/faults

vm-test: setup ## the tc backend on a real sch_netem: a stock Debian kernel under qemu TCG
	$(PYTEST) tests/vm/test_vm.py
	$(PY) -m vm.run --timeout 1500 --cpus 1 -- $(PY) -m pytest -q -rs -p no:cacheprovider tests/emulation/test_fidelity.py \
		tests/emulation/test_netem_applied.py \
		tests/emulation/test_topologies.py::test_three_sites_reach_each_other_over_their_own_lines --backend tc

vm-test-wire: setup ## netem's options on the live wire under tc (duplicate, corrupt, reorder, slot, a rate trace) in the VM (not in make test: CI's time)
	$(PY) -m vm.run --timeout 1500 --cpus 1 -- $(PY) -m pytest -q -rs -p no:cacheprovider tests/emulation/test_netem_options_wire.py -k tc

bench: setup ## benchmarks that print numbers (speed and accuracy targets)
	$(PY) benchmarks/bench_engine.py
	$(PY) benchmarks/bench_roles.py
	$(PY) benchmarks/bench_scale.py
	$(PY) benchmarks/bench_shaper.py
	$(PY) benchmarks/bench_lan.py
	$(PY) benchmarks/bench_docker.py
	$(PY) benchmarks/bench_experiment.py
	$(PY) benchmarks/bench_sweep.py
	$(PY) benchmarks/bench_analysis.py
	$(PY) benchmarks/bench_links.py
	$(PY) benchmarks/bench_roofline.py
	$(PY) benchmarks/bench_serve_load.py --steps 1,4,16,48,128 --requests-per-step 48 --set slo.ttft_ms=20000
	$(PY) -m vm.run --timeout 1500 --cpus 1 -- $(PY) benchmarks/bench_links.py --backend tc

run-experiment: setup ## run EXP (default pdd-vs-baselines) [PROFILE=name] [BACKEND=tc|userspace] [SET="k=v ..."]
	$(PDDLAB) run $(EXP) $(PROFILE_ARG) --backend $(BACKEND) $(foreach s,$(SET),--set $(s))

# One spec over a grid x repeats: make sweep EXP=pdd-smoke OVER="link.loss_pct=0,1,3" REPEAT=2
# (several axes: OVER="link.loss_pct=0,1 link.delay_ms=20,60"; finish an interrupted one: make sweep RESUME=results/<dir>)
OVER    ?=
REPEAT  ?= 1
RESUME  ?=
SAME_SEED ?=
sweep: setup ## EXP over a grid x repeats: OVER="key=v1,v2" REPEAT=n [SAME_SEED=1] (RESUME=dir finishes one)
ifeq ($(RESUME),)
	$(PDDLAB) sweep $(EXP) --repeat $(REPEAT) --backend $(BACKEND) $(PROFILE_ARG) $(if $(SAME_SEED),--same-seed) $(foreach o,$(OVER),--over $(o)) $(foreach s,$(SET),--set $(s))
else
	$(PDDLAB) sweep --resume $(RESUME)
endif

analyze: setup ## recompute summary and plots from a run directory alone: RUN=results/<dir>
	$(PDDLAB) analyze $(RUN)

# Two or more runs (or sweeps) of one spec side by side: make compare DIRS="results/<a> results/<b>"
DIRS    ?=
compare: setup ## runs (or sweeps) side by side, later over the first: DIRS="results/<a> results/<b>"
	$(PDDLAB) compare $(DIRS)

docs-figures: setup ## regenerate docs/' tables of figures from the runs kept in docs/runs/
	$(PY) scripts/docs_figures.py

profiles: setup ## list the shipped netem profiles
	@$(PDDLAB) profiles

# The roles behind an OpenAI-compatible API on 127.0.0.1:$(PORT) until Ctrl-C: make serve EXP=pdd-smoke
PORT    ?= 8000
serve: setup ## the roles behind an OpenAI-compatible API on 127.0.0.1:PORT until Ctrl-C
	$(PDDLAB) serve $(EXP) --port $(PORT) --backend $(BACKEND) $(PROFILE_ARG) $(foreach s,$(SET),--set $(s))

TOPO    ?=
# CUSTOM=FILE: a Mininet topology class, as mn's --custom FILE --topo NAME (TOPO=NAME[,ARG,...] then).
net: setup ## the topology alone with Mininet's CLI [PROFILE=name] [TOPO=topology file] [CUSTOM=file.py TOPO=name]
	$(PDDLAB) net $(PROFILE_ARG) $(if $(CUSTOM),--custom $(CUSTOM)) $(if $(TOPO),--topo $(TOPO)) --backend $(BACKEND)

clean: ## remove what crashed runs left, by their own names and ids
	@if [ -x $(PDDLAB) ]; then $(PDDLAB) clean; fi
