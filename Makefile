# Two commands do everything on a fresh Debian machine:
#   make run   -> install what is missing, then serve on 127.0.0.1:8000
#   make test  -> the same set-up, then the whole test suite
VENV ?= .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000
EXTRAS ?= test,lab,llm,hf,otel,cluster

.PHONY: setup run run-dev test bench mutation clean
setup:
	EXTRAS=$(EXTRAS) VENV=$(VENV) bash scripts/setup.sh

run: setup
	$(VENV)/bin/linguafusion serve --host $(HOST) --port $(PORT)

run-dev: setup
	$(VENV)/bin/linguafusion serve --host 127.0.0.1 --port $(PORT) --no-auth

# The suite is in three tiers by what its tests start (docs/testing.md): tests/unit (nothing: pure cores, fakes of
# the ports, worker processes under test; ~2 min), tests/service (a live server or the real models in-process) and
# tests/e2e (the CLI, a browser, several server processes, a Ray cluster). The unit tier runs first and a failure
# there ends the run (-x: nothing above it is worth running). Then service and e2e on TEST_WORKERS pytest-xdist
# workers, one test file per worker at a time (--dist loadfile: a module's live servers and fixed ports stay on one
# worker); TEST_WORKERS=0 runs them in one process. SERIAL_TESTS run after them, alone, because a second worker
# loading the machine's 2 cores made them fail: test_cluster.py's two-node Ray cluster missed a wait (a listener's
# gateway, 30 s); test_bad_input.py's refused uploads on a kept connection ended in 'Server disconnected without
# sending a response' instead of their 413 (a server-side race, open). The serial tier runs even when the tier
# before it fails (then the run fails); a worker that crashes costs only its test (tests/xdist_guard.py mends xdist
# 3.8.0's replacement of a crashed worker, which hung or stopped the run), every test has a timeout (pyproject:
# pytest-timeout), and .ci/run's watchdog (scripts/watchdog.sh) bounds the whole run. mypy checks the tests' fakes
# against the ports they stand in for (tests/fakes.py).
TEST_WORKERS ?= 2
SERIAL_TESTS := tests/e2e/test_cluster.py tests/e2e/test_bad_input.py
PYTEST := $(PY) -m pytest -q -p no:cacheprovider
test: setup
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/mypy src/lingua_fusion tests/fakes.py
	bash scripts/with-redis.sh bash -c '$(PYTEST) -x -n $(TEST_WORKERS) --dist loadfile tests/unit || exit $$?; \
	  $(PYTEST) -n $(TEST_WORKERS) --dist loadfile tests/service tests/e2e $(addprefix --ignore=,$(SERIAL_TESTS)); \
	  a=$$?; $(PYTEST) $(SERIAL_TESTS); b=$$?; exit $$(( a ? a : b ))'

# mutation testing of the pure cores (mutmut, one module at a time; slow: not part of `make test`)
# MODULES="scheduler journal" runs some; the others keep their results in bench/results/mutation.json
mutation: setup
	$(PY) scripts/mutation.py $(MODULES)

bench: setup
	$(PY) bench/file_latency.py --json bench/results/file_latency.json

clean:
	rm -rf $(VENV) .setup-stamp
