# k3fleet developer entry points. Every target sets up what it needs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.k3fleet-installed

.PHONY: venv demo test test-unit test-integration test-system molecule lint bench bench-verdict bench-merge wheel-check clean testbed-down
.PHONY: bench-ssh bench-node collection collection-check ee-check ssh-fleet-down test-under-load

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# The demo needs k3fleet alone, not the test tools (molecule, ansible-lint, mypy).
DEMO_STAMP := $(VENV)/.k3fleet-demo-installed
$(DEMO_STAMP): pyproject.toml
	@mkdir -p runs
	@echo "make demo: creating $(VENV) and installing k3fleet (pip's output: runs/demo-pip.log)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@{ $(BIN)/python -m pip install --quiet --upgrade pip && $(BIN)/python -m pip install --quiet -e . ; } \
	  > runs/demo-pip.log 2>&1 || { tail -n 5 runs/demo-pip.log; echo "make demo: pip failed (runs/demo-pip.log)"; exit 1; }
	@touch $(DEMO_STAMP)

# The whole path on the lab (k3fleet lab demo): audit -> plan -> upgrade --check -> accept all -> decide -> watch.
# Its change night needs Debian's dpkg/apt tools: said before it happens, root only (scripts/demo-deps.sh);
# without root, or with K3FLEET_NO_SYSTEM_PACKAGES=1, the demo says which step it skips and why.
# apt's own output goes to $(DEMO_LOG), not the screen: one line says what happens, the log has the rest.
DEMO_LOG := runs/demo-setup.log
demo: $(DEMO_STAMP)
	@mkdir -p runs
	@if [ "$$(id -u)" -eq 0 ] && [ -z "$$K3FLEET_NO_SYSTEM_PACKAGES" ]; then \
	  echo "make demo: installing the missing Debian packages among gcc, libc6-dev, dpkg-dev, apt-utils, python3-apt, openssh-client and what apt says they need (scripts/demo-deps.sh; K3FLEET_NO_SYSTEM_PACKAGES=1 skips); apt's output: $(DEMO_LOG)"; \
	  bash scripts/demo-deps.sh > $(DEMO_LOG) 2>&1 || { tail -n 5 $(DEMO_LOG); echo "make demo: installing Debian packages failed (whole output: $(DEMO_LOG))"; exit 1; }; \
	else echo "make demo: not root (or K3FLEET_NO_SYSTEM_PACKAGES set): no Debian packages installed; upgrade --check runs only if its tools are here"; fi
	@echo '$$ k3fleet lab demo'
	@$(BIN)/k3fleet lab demo

# The collection's own unit tests (tests/unit/plugins in the collection; ansible-test units runs them from the
# built collection in make collection-check) run with the repository's tests too.
COLLECTION_UNITS := ansible_collections/k3fleet/gpu/tests/unit

test: $(STAMP)
	# Headless Chromium for the HTML report test (root only: apt; without it that one test skips).
	# Said before it happens; K3FLEET_NO_SYSTEM_PACKAGES=1 skips it.
	if [ "$$(id -u)" -eq 0 ] && [ -z "$$K3FLEET_NO_SYSTEM_PACKAGES" ]; then \
	  echo "make test: installing Debian packages if missing (chromium, fonts-dejavu-core: scripts/report-deps.sh; K3FLEET_NO_SYSTEM_PACKAGES=1 skips)"; \
	  bash scripts/report-deps.sh; fi
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/pytest -q -n auto --dist loadfile -m "not system and not serving" tests $(COLLECTION_UNITS)

# make test three times in a row with every core kept busy (issue: tests that hold under load).
test-under-load: $(STAMP)
	bash scripts/test_under_load.sh --runs 3 --spinners 8

test-unit: $(STAMP)
	$(BIN)/pytest -q tests/unit $(COLLECTION_UNITS)

test-integration: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/pytest -q tests/integration

# Root, namespaces, systemd-nspawn, apt, Slurm, podman: see README "System tests".
test-system: $(STAMP)
	bash scripts/testbed-deps.sh
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/pytest -q -m system tests/system

# Every role's molecule scenario alone (test-system runs them too): molecule/default creates the testbed's
# guests, each role's scenario runs on them (.config/molecule/config.yml, shared_state), and the testbed is down
# afterwards. `molecule reset` first drops a stale ~/.ansible/tmp/molecule.* from an interrupted run (with
# shared_state it is molecule/default's for every scenario; `reset --all` would fail on the second scenario).
# One scenario: `make molecule MOLECULE_ARGS="-s nvidia_driver"` (molecule/default still creates and destroys).
MOLECULE_ARGS ?= --all
molecule: $(STAMP)
	bash scripts/testbed-deps.sh
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/molecule reset
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/molecule test $(MOLECULE_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check k3fleet ansible_collections tests scripts
	$(BIN)/mypy k3fleet
	# The collection's plugins, every function annotated (tests/unit/test_collection_build.py), bodies checked too.
	$(BIN)/mypy --follow-imports=silent --explicit-package-bases --check-untyped-defs $$(find ansible_collections/k3fleet/gpu/plugins -name '*.py')
	# Playbooks and roles, production profile (.ansible-lint: kinds, extra vars for syntax-check).
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/ansible-lint -q playbooks ansible_collections/k3fleet/gpu/roles

bench: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python scripts/bench_audit.py --sizes 50 200 1000

# The same comparison over real SSH: one network namespace and sshd per lab host (root; docs/scale.md).
# Every size twice on its fleet, then one table of ratios, node CPU per host and load averages;
# sizes from the command line (make bench-ssh BENCH_SSH_SIZES="50 200"). BENCH_SSH_ARGS adds options
# (--playbook: ansible-playbook by hand beside the audit; --mitogen: Mitogen's strategy too).
BENCH_SSH_SIZES ?= 50 200 1000
BENCH_SSH_ARGS ?=
bench-ssh: $(STAMP)
	bash scripts/sshfleet-deps.sh
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python scripts/bench_audit.py --ssh --sizes $(BENCH_SSH_SIZES) --forks 20 \
		--repeat 2 $(BENCH_SSH_ARGS)

ssh-fleet-down: $(STAMP)
	$(BIN)/k3fleet lab ssh-fleet down

# The node side of one lab host apart (no root): the baseline's and the audit's module runs interleaved,
# ratios to the baseline, and the audit's split (module_utils compile, collectors, commands); docs/scale.md.
bench-node: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python scripts/bench_audit.py --node --repeat 30

# The Ansible collection k3fleet.gpu, built from this repository into dist/ (docs/scale.md "Collection").
collection: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python scripts/build_collection.py

# CI: build, install, ansible-doc, a user's FQCN playbook on the lab, ansible-test sanity (no containers).
collection-check: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python scripts/collection_check.py --sanity

# The lab audit, the collection's unit tests and the tests of its ansible-core patches (AnsiballZ wrapper,
# strategy) under every ansible-core series meta/runtime.yml claims, each in its own venv under
# .cache/ansible-matrix/ (made with pip on first use); a table series -> pass/fail and seconds (docs/scale.md
# "Collection"). Not part of CI: it needs the package index the first time.
.PHONY: collection-matrix
collection-matrix: $(STAMP)
	$(BIN)/python scripts/collection_matrix.py

# CI: the execution environment definition is accepted by ansible-builder (no container engine here).
ee-check: $(STAMP)
	rm -rf build/ee build/ee-wheel
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/ansible-builder create -f execution-environment.yml -c build/ee
	# The context's source tree must build the wheel the image installs, with the package and the collection.
	$(BIN)/python -m pip wheel --quiet --no-deps --no-build-isolation -w build/ee-wheel build/ee/_build/k3fleet-src
	$(BIN)/python -c "import sys, zipfile, glob; n = set(zipfile.ZipFile(glob.glob('build/ee-wheel/k3fleet-*.whl')[0]).namelist()); \
	  need = ['k3fleet/cli/base.py', 'k3fleet/_data/playbooks/audit.yml', 'ansible_collections/k3fleet/gpu/plugins/modules/k3fleet_host_info.py', \
	          'ansible_collections/k3fleet/gpu/roles/k3_verify/tasks/main.yml']; miss = [x for x in need if x not in n]; \
	  sys.exit('ee-check: the image wheel lacks ' + ', '.join(miss) if miss else 0)"
	@echo "ee-check: build context and its wheel are complete"

bench-verdict: $(STAMP)
	$(BIN)/python scripts/bench_verdict.py

# k3fleet merge of 100,000 hosts' audit slices, as its own process: wall time and peak RSS (docs/scale.md).
bench-merge: $(STAMP)
	$(BIN)/python scripts/bench_verdict.py --merge 100000

# AWX's execution path: one controller against the lab fleet split over 1, 2 and 4
# transmit | worker | process pipelines merged by k3fleet merge (docs/scale.md "AWX's execution path").
.PHONY: bench-awx
bench-awx: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python scripts/bench_awx_stream.py --count 40 --workers 1 2 4

# accept load's generator beside guidellm and vLLM's own benchmark (from the lab's CPU build, .cache/vllm-venv) on
# the vLLM simulator at 64, 256, 1024 streams and on the lab's real vLLM at 4; then open loop beside
# vllm bench serve --request-rate (Poisson) at 5, 10, 20/s on the simulator and 2, 4/s on the real vLLM, which
# one lock keeps to one user at a time (docs/acceptance-load.md).
# guidellm brings torch and transformers: it gets its own venv, never the test venv.
.PHONY: bench-load
BENCH_VENV ?= .venv-bench
bench-load:
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet -e '.[bench-load]'
	$(BENCH_VENV)/bin/python scripts/bench_load.py --streams 64 256 1024 --vllm-bench --real
	flock /tmp/k3fleet-vllm.lock $(BENCH_VENV)/bin/python scripts/bench_load.py --no-guidellm --rates 5 10 20 \
		--rate-seconds 20 --real --real-rates 2 4

# How closely accept load --trace keeps a trace's arrival times: 200 requests/s for 10 s on the simulator
# (docs/acceptance-load.md "Trace replay"); prints the arrival error, asserts nothing.
.PHONY: bench-trace
bench-trace: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python scripts/bench_trace.py --rate 200 --seconds 10 --repeat 3

# Every acceptance probe against a real vLLM: the CPU build in its own venv (.cache/vllm-venv, pinned;
# built here on first use, about 3.5 GB and 10 minutes) serving a tiny model made on the spot
# (docs/acceptance.md "The serving suite"). Four server starts, one at a time.
.PHONY: test-serving vllm-down
test-serving: $(STAMP)
	$(BIN)/k3fleet lab vllm prepare
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/pytest -q -m serving tests/serving

vllm-down: $(STAMP)
	$(BIN)/k3fleet lab vllm down

testbed-down: $(STAMP)
	$(BIN)/k3fleet lab testbed down

clean:
	rm -rf $(VENV) dist build runs .pytest_cache .ruff_cache .mypy_cache
