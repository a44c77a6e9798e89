# pddlab: the single entry point. CI runs `make test` (via .ci/run).
PY      := .venv/bin/python
PDDLAB  := .venv/bin/pddlab
EXP     ?= pdd-vs-baselines
SET     ?=
RUN     ?=
PROFILE ?= wan-cross-country
BACKEND ?= auto
PYTEST  := $(PY) -m pytest -q -rs

.PHONY: setup image lint test test-unit test-roles test-ray test-emulation test-faults test-docker vm-test bench run-experiment sweep analyze clean profiles net serve

setup:
	@bash scripts/setup.sh

# `clean` first: a run that crashed (or a machine restarted mid-run) leaves state the topology tiers refuse.
test: setup clean lint test-unit test-roles test-ray test-emulation test-faults test-docker vm-test

# ruff (configured in pyproject.toml; the generated gRPC stubs are excluded): lint and format check.
lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

test-unit: setup
	$(PYTEST) tests/unit tests/experiments tests/vm/test_vm_builders.py

# The PDD roles as real processes on loopback (no root needed).
test-roles: setup
	$(PYTEST) tests/roles tests/e2e

# The roles under Ray on a two-node Ray cluster on loopback (no root, no topology), and `pddlab run --cluster`
# against it. (The Ray smoke experiment in the topology, a Ray node per host, is in tests/emulation.)
test-ray: setup
	$(PYTEST) tests/ray

# The worker image, built from a local debootstrap base (no registry); BASE_IMAGE=... overrides.
# VARIANT=cuda: the same image with a CUDA build of torch (2.14.1), for `device: cuda` pools (built only when asked).
VARIANT ?= cpu
image: setup
	$(PDDLAB) image --variant $(VARIANT)

test-docker: setup image
	$(PYTEST) tests/docker

test-emulation: setup
	$(PYTEST) tests/emulation

# Faults under load in the topology: every component SIGKILLed mid-run, the WAN down, heavy loss.
test-faults: setup
	$(PYTEST) tests/faults

# The tc backend on a real sch_netem: a stock Debian kernel under qemu TCG.
vm-test: setup
	$(PYTEST) tests/vm/test_vm.py
	$(PY) -m vm.run --timeout 1500 --cpus 1 -- $(PY) -m pytest -q -rs -p no:cacheprovider tests/emulation/test_fidelity.py --backend tc

bench: setup
	$(PY) benchmarks/bench_engine.py
	$(PY) benchmarks/bench_roles.py
	$(PY) benchmarks/bench_scale.py
	$(PY) benchmarks/bench_shaper.py
	$(PY) benchmarks/bench_docker.py
	$(PY) benchmarks/bench_experiment.py
	$(PY) benchmarks/bench_sweep.py
	$(PY) benchmarks/bench_analysis.py
	$(PY) benchmarks/bench_links.py
	$(PY) -m vm.run --timeout 1500 --cpus 1 -- $(PY) benchmarks/bench_links.py --backend tc

run-experiment: setup
	$(PDDLAB) run $(EXP) --profile $(PROFILE) --backend $(BACKEND) $(foreach s,$(SET),--set $(s))

# One spec over a grid x repeats: make sweep EXP=pdd-smoke OVER="link.loss_pct=0,1,3" REPEAT=2
# (several axes: OVER="link.loss_pct=0,1 link.delay_ms=20,60"; finish an interrupted one: make sweep RESUME=results/<dir>)
OVER    ?=
REPEAT  ?= 1
RESUME  ?=
sweep: setup
ifeq ($(RESUME),)
	$(PDDLAB) sweep $(EXP) --repeat $(REPEAT) --backend $(BACKEND) $(if $(filter command line,$(origin PROFILE)),--profile $(PROFILE)) $(foreach o,$(OVER),--over $(o)) $(foreach s,$(SET),--set $(s))
else
	$(PDDLAB) sweep --resume $(RESUME)
endif

# Recompute summary and plots from a run directory alone: make analyze RUN=results/<dir>
analyze: setup
	$(PDDLAB) analyze $(RUN)

profiles: setup
	@$(PDDLAB) profiles

# The roles behind an OpenAI-compatible API on 127.0.0.1:$(PORT) until Ctrl-C: make serve EXP=pdd-smoke
PORT    ?= 8000
serve: setup
	$(PDDLAB) serve $(EXP) --port $(PORT) --backend $(BACKEND) $(if $(filter command line,$(origin PROFILE)),--profile $(PROFILE)) $(foreach s,$(SET),--set $(s))

# The topology alone with Mininet's CLI (p1 ping -c 3 md1, link, swap PROFILE, capture start|stop, exit)
net: setup
	$(PDDLAB) net --profile $(PROFILE) --backend $(BACKEND)

clean:
	@if [ -x $(PDDLAB) ]; then $(PDDLAB) clean; fi
