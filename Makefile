# tessera -- the plain runner. `make demo` runs the local demo, `make test` runs every test.
# Everything a fresh machine needs is installed by these targets (into .venv and a cache
# outside the repo, see README).

PYTHON  ?= python3.11
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed-stamp
export PYTHONPATH := $(CURDIR)/e2e:$(CURDIR)/sim

.PHONY: install lint typecheck crds test unit sim hook controlplane cluster demo bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

lint: install
	$(PY) -m ruff check .

typecheck: install
	$(PY) -m mypy operator/tessera node-daemon/tessera_node sim/tessera_sim e2e/tessera_e2e

# Regenerate crds/ from the API types (a test fails when they differ).
crds: install
	$(VENV)/bin/tessera crds --out crds

# The simulated GPU node (fake libcuda, libnvidia-ml, nvidia-smi) and libtessera.
sim: install
	$(MAKE) -C sim PYTHON=$(CURDIR)/$(PY)

hook: install sim
	$(MAKE) -C hook PYTHON=$(CURDIR)/$(PY)

# kube-apiserver, etcd, kube-controller-manager, kube-scheduler, kubectl, built once
# from the Go module proxy into the cache (TESSERA_CACHE, default ~/.cache/tessera).
controlplane: install
	$(PY) -m tessera_e2e build

# A local control plane for a person; prints the KUBECONFIG to use.
cluster: controlplane
	$(PY) -m tessera_e2e cluster

# The main job: the local demo.
demo: controlplane sim
	$(PY) -m tessera_e2e demo

# Everything: lint, types, unit, simulator, hook and integration tests.
test: install lint typecheck sim hook controlplane
	$(PY) -m pytest

unit: install
	$(PY) -m pytest operator/tests node-daemon/tests

bench: install sim hook
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) build .mypy_cache .ruff_cache .pytest_cache
	-$(MAKE) -C sim clean
	-$(MAKE) -C hook clean
