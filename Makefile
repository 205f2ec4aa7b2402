# Two entry points: `make report` and `make test`. Both create .venv if missing and install everything at the
# exact versions of constraints.txt (what the report was last built and tested with), torch pinned to the 2.13.0
# CPU build first (a loose torch requirement would pull a multi-GB CUDA build).  Changing the lock reinstalls.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.oomlab-installed
LOCK := constraints.txt
PIP := $(PY) -m pip install --quiet -c $(LOCK)
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export MPLBACKEND := Agg

.PHONY: install report test test-fast lint browser clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip setuptools
	$(PIP) torch==2.13.0
	$(PIP) -e '.[dev]'
	DS_BUILD_OPS=0 $(PIP) --no-build-isolation 'deepspeed>=0.14'
	touch $(STAMP)

report: install
	$(PY) -m oomlab run

lint: install
	$(PY) -m ruff check lib tests notebooks benchmarks scripts

# The browser tests drive Debian's chromium through Playwright (never a downloaded browser): install it when
# missing and root; elsewhere those tests skip and say why.
browser:
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium) \
	      || echo "could not install chromium: the browser tests will skip"; \
	  else echo "chromium not found and not root: the browser tests will skip (sudo apt-get install -y chromium)"; fi; }

test: install lint browser
	$(PY) -m pytest

test-fast: install  # the developer's loop: no kernels, pipeline runs, CPU training, browser or fuzzing (make test runs all)
	$(PY) -m pytest -m "not heavy" -q

clean:
	rm -rf outputs/notebooks outputs/results outputs/configs outputs/report.html outputs/.oomlab-run.json
