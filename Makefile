# One entry point for contributors and CI. Every target but `setup` depends on the virtual environment.
PY      := .venv/bin/python
VENV    := .venv/.installed
BIN     := .local/bin
TOOLS   := $(BIN)/etcd $(BIN)/kwok $(BIN)/kube-apiserver $(BIN)/kube-scheduler $(BIN)/helm
NODES   ?= 1000
PYTEST_ARGS ?=

.PHONY: setup tools manifests lint typecheck imports unit integration test cluster-up cluster-down cluster-status demo bench clean

setup: $(VENV)

$(VENV): pyproject.toml
	python3.11 -m venv .venv
	.venv/bin/pip install --quiet --upgrade pip
	.venv/bin/pip install --quiet -e '.[dev]'
	touch $(VENV)

# The Go builds are incremental (scale/tools/build.sh): nothing rebuilds when the module files did not change.
tools: $(VENV)
	scale/tools/build.sh $(BIN)

# The plain YAML in manifests/ is rendered from the Helm chart (a unit test checks it is up to date).
manifests: $(VENV)
	scale/tools/build.sh $(BIN) helm
	manifests/render.sh

lint: $(VENV)
	.venv/bin/ruff check common worker coordinator scale agent_scheduler tests
	.venv/bin/ruff format --check common worker coordinator scale agent_scheduler tests

typecheck: $(VENV)
	.venv/bin/mypy common worker coordinator scale agent_scheduler tests

imports: $(VENV)
	.venv/bin/lint-imports

unit: $(VENV)
	$(PY) -m pytest tests -m "not integration" $(PYTEST_ARGS)

integration: $(VENV) tools
	$(PY) -m pytest tests -m integration $(PYTEST_ARGS)

test: lint typecheck imports tools
	$(PY) -m pytest tests $(PYTEST_ARGS)

cluster-up: $(VENV) tools
	.venv/bin/agent-scheduler cluster up --nodes $(NODES)

cluster-down: $(VENV)
	.venv/bin/agent-scheduler cluster down

cluster-status: $(VENV)
	.venv/bin/agent-scheduler cluster status

demo: $(VENV) tools
	.venv/bin/agent-scheduler demo --nodes $(NODES)

bench: $(VENV)
	.venv/bin/agent-scheduler bench engine

clean:
	-.venv/bin/agent-scheduler cluster down
	rm -rf .local/cluster results
