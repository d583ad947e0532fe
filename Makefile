PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint bench docs clean celery-suite

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "celeriac needs Python >= 3.11"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/quickstart/run.py

# In three processes on two CPUs (most slow tests wait on worker processes and brokers,
# not on the CPU: 425 s against 591 s in two), a module's tests in one of them; and beside
# them, in a fourth process, one at a time, the tests that speak Celery's layout, which has
# no namespace to keep two of them apart. They keep apart from the rest: Redis databases
# 2 and 4-13 (flushed; the rest use 0, and 1 and 3 in test_db_isolation.py), Celery's
# fixed names on RabbitMQ (the rest's are namespaced), databases celeriac_compat and
# celeriac_compat_mysql. Run after the rest, they added 149 s to a 480 s run.
SERIAL_TESTS := tests/compat tests/integration/test_kombu_pubsub.py

# Celery's virtualenv for the compatibility tests is made first, outside any test's
# timeout and before two processes could each start making it (pip from PyPI; without
# it those tests skip on a user's machine and fail under CI=true).
# The serial group's output goes to a file, printed after the rest's; either failing fails
# the target. A shell gives a background job an ignored SIGINT, which Python keeps: the
# default is put back before pytest starts, so that Ctrl-C stops (and cleans up) both.
PYTEST_SIGINT := $(PY) -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.executable, [sys.executable, "-m", "pytest", *sys.argv[1:]])'
test: $(STAMP)
	@scripts/services.sh
	@$(PY) -c 'from tests.compat.conftest import _venv; _venv().ensure(timeout=600)' || \
		echo "no Celery virtualenv: the compatibility tests will say why"
	@log=$$(mktemp /tmp/celeriac-serial-tests.XXXXXX) && trap 'rm -f "$$log"' EXIT && trap 'exit 130' INT TERM && \
	echo "$(PY) -m pytest -q $(SERIAL_TESTS) > $$log (in the background)" && \
	{ $(PYTEST_SIGINT) -q $(SERIAL_TESTS) >"$$log" 2>&1 & } && serial=$$! && \
	echo "$(PY) -m pytest -q -n 3 --dist loadfile $(addprefix --ignore=,$(SERIAL_TESTS)) tests" && \
	{ $(PY) -m pytest -q -n 3 --dist loadfile $(addprefix --ignore=,$(SERIAL_TESTS)) tests; \
	  rest=$$?; wait $$serial; own=$$?; \
	  echo "--- $(SERIAL_TESTS) (one at a time, beside the above):"; cat "$$log"; \
	  [ $$rest -eq 0 ] && [ $$own -eq 0 ]; }

test-fast: $(STAMP)
	$(PY) -m pytest -q -n 3 --dist worksteal -m "not slow" tests

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples scripts
	$(VENV)/bin/mypy src
	$(VENV)/bin/lint-imports

# Celery 5.5.3's own integration suite (t/integration), ported by the rename alone, on a
# real worker on Redis (database 14); not part of make test. scripts/celery_suite.py says how.
celery-suite: $(STAMP)
	@scripts/services.sh
	$(PY) scripts/celery_suite.py

bench: $(STAMP)
	@scripts/services.sh
	$(PY) bench/run.py

# The docs site (mkdocs.yml, docs/) into site/, warnings as errors; no network but PyPI.
docs: $(STAMP)
	@$(PY) -c 'import mkdocs, material, mkdocstrings_handlers.python' 2>/dev/null || \
		$(PY) -m pip install -q -e '.[docs]'
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .import_linter_cache celeriac.db* site
