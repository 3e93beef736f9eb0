# xsearch: `make demo` runs the main job on the embedded default, `make test` runs the suite.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: demo test bench lint format install clean readme

$(STAMP): pyproject.toml setup.py constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# The default pipeline (xsearch run --print-config); re-running continues or reprints a finished run.
demo: $(STAMP)
	$(VENV)/bin/xsearch run

# One pytest worker per core (tests/conftest.py gives each one torch thread); TEST_JOBS=0 runs in one process.
TEST_JOBS ?= auto
test: $(STAMP)
	$(PY) -m pytest tests -n $(TEST_JOBS)

bench: $(STAMP)
	$(PY) bench/attention.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache

# Regenerate the README's variant table from the registry (a test checks they agree).
readme: $(STAMP)
	$(PY) -c "import re, subprocess, sys; t = subprocess.run([sys.executable, '-m', 'xsearch.cli', 'list', '--markdown'], capture_output=True, text=True, check=True).stdout; s = open('README.md').read(); a, b = '<!-- variants:start -->\n', '<!-- variants:end -->'; open('README.md', 'w').write(s[: s.index(a) + len(a)] + t + s[s.index(b):])"
