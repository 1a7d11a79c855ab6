# modelpool — developer entry points.  The target names are a contract (see README):
#   test, demo, bench, soak, upgrade-check, testbin, cluster-up, cluster-down, e2e-kind, crds, lint, venv, images, lowest,
#   release, tools
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV ?= .venv
PY := $(VENV)/bin/python
export KUBECONFIG_LOCAL := $(CURDIR)/.cluster/kubeconfig

.PHONY: help
help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

.PHONY: venv
venv: $(VENV)/.installed ## the Python environment (uv; torch, transformers, kopf, test clients)

$(VENV)/.installed: pyproject.toml uv.lock hack/venv.sh
	bash hack/venv.sh $(VENV)
	@touch $@

.PHONY: tools
tools: ## the Debian tools the images and tests use (buildah, runc, debootstrap, promtool), when missing
	bash hack/tools.sh

.PHONY: images
images: ## build the operator and server images with buildah (no daemon; skipped when their inputs are unchanged)
	bash hack/images.sh

.PHONY: release
release: venv testbin images ## dist/: the wheel and sdist, the packaged chart, both images as OCI archives, SHA256SUMS
	bash hack/release.sh

.PHONY: lowest
lowest: ## the unit tests (operator, gateway, server, contract) at the lowest dependency versions pyproject.toml allows
	bash hack/lowest.sh

.PHONY: testbin
testbin: ## build kube-apiserver, controller-manager, scheduler, kubectl, etcd, kwok, kwokctl, helm, the endpoint picker into bin/
	bash hack/testbin.sh

.PHONY: cluster-up
cluster-up: testbin venv ## start the local control plane (kubeconfig: .cluster/kubeconfig)
	bash hack/cluster.sh up

.PHONY: cluster-down
cluster-down: ## stop the local control plane
	bash hack/cluster.sh down

.PHONY: crds
crds: venv ## regenerate crds/*.yaml and the chart's CRD templates from the pydantic models
	$(PY) -m modelpool_operator.crdgen --write
	bash hack/sync-chart-crds.sh

.PHONY: lint
lint: venv ## ruff + mypy --strict
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Two workers (pytest-xdist), each a pytest session with a control plane of its own (conftest.py), and whole
# files to one worker (module fixtures shared): most of a test's time is waiting on the API server and on
# processes, so two at once take about half as long. The slowest tests are listed at the end of every run
# (CI's log too): the suite must stay under 25 minutes. PYTEST_ARGS= runs it in one process.
PYTEST_ARGS ?= -n 2 --dist loadfile --durations=20

.PHONY: test
# The images and the release are tested too (the pods of e2e/test_images.py run from them; e2e/test_release.py
# checks dist/): both are skipped in seconds when their inputs are unchanged.
test: venv testbin tools lint images release ## lint, then every test (unit + integration on the local control plane, the images, the release)
	$(VENV)/bin/pytest $(PYTEST_ARGS)

.PHONY: demo
demo: venv testbin ## the operator serving MiniLM on the local control plane, end to end
	bash hack/demo.sh

.PHONY: bench
bench: venv testbin ## server vs direct model, overload, health-during-load, workers sharing a node, tail, 429 rate, models per shared host and wake times, continuous batching vs serial generate, gateway vs direct, control-plane scale, shared-host placement audit
	$(PY) -m bench.server
	$(PY) -m bench.cpu_quota
	$(PY) -m bench.limits
	$(PY) -m bench.density
	$(PY) -m bench.generation
	$(PY) -m bench.gateway
	$(PY) -m bench.controlplane
	$(PY) -m bench.placement

.PHONY: soak
soak: venv testbin ## 30 min of faults under load, audited at every event (python -m bench.soak; SOAK_ARGS=)
	$(PY) -m bench.soak --docs $(SOAK_ARGS)

.PHONY: upgrade-check
upgrade-check: venv testbin ## 0.2.0 helm-upgraded to this tree under traffic, then the leader SIGKILLed, audited (python -m bench.upgrade)
	$(PY) -m bench.upgrade --docs $(UPGRADE_ARGS)

.PHONY: e2e-kind
e2e-kind: venv testbin ## the e2e suite on a kind cluster (needs a Docker engine)
	bash e2e/kind.sh
