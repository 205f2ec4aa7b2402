# Two entry points: `make report` and `make test`. Both create .venv if missing and install everything,
# torch pinned to the 2.13.0 CPU build first (a loose torch requirement would pull a multi-GB CUDA build).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.oomlab-installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export MPLBACKEND := Agg

.PHONY: install report test lint browser clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	DS_BUILD_OPS=0 $(PY) -m pip install --quiet --no-build-isolation 'deepspeed>=0.14'
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

clean:
	rm -rf outputs/notebooks outputs/results outputs/report.html
