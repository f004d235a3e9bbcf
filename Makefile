# tessera -- the plain runner. `make demo` runs the local demo, `make test` runs every test.
# Everything a fresh machine needs is installed by these targets (into .venv and a cache
# outside the repo, see README).

PYTHON  ?= python3.11
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed-stamp
export PYTHONPATH := $(CURDIR)/e2e:$(CURDIR)/sim

.PHONY: sysdeps install lint typecheck crds policies protos test unit sim hook controlplane cluster images demo \
	chart-docs \
	bench clean

install: $(STAMP)

# System tools the tests use: clang + libFuzzer runtime (hook fuzz targets), valgrind; for the
# test bed's nodes runc, the CNI plugins, iptables (kube-proxy, CNI) and a static busybox (the
# workload image's shell), see e2e/README.md; Prometheus and promtool (the alerting rules'
# unit tests, the dashboard checked against live metrics, docs/operate.md). Installed from
# Debian's packages when missing (the machines run as root); RUNLEVEL=1 keeps the package from
# starting a Prometheus service of its own (the tests start theirs).
SYSDEPS_OK := $(shell command -v clang >/dev/null && command -v valgrind >/dev/null && \
	ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 && \
	test -x /usr/sbin/runc && test -x /usr/lib/cni/bridge && test -x /usr/sbin/iptables && \
	test -x /usr/bin/busybox && busybox --list | grep -qx httpd && command -v ip >/dev/null && \
	command -v nsenter >/dev/null && command -v prometheus >/dev/null && \
	command -v promtool >/dev/null && test -x /usr/bin/openssl && echo yes)
sysdeps:
ifneq ($(SYSDEPS_OK),yes)
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang libclang-rt-14-dev valgrind \
		runc containernetworking-plugins iptables busybox-static iproute2 util-linux openssl
	RUNLEVEL=1 DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		prometheus
endif

# The three distributions, editable, and the tools (pyproject.toml: the workspace).
$(STAMP): pyproject.toml core/pyproject.toml operator/pyproject.toml node-daemon/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ./core -e ./operator -e ./node-daemon -e '.[dev]'
	touch $@

lint: install
	$(PY) -m ruff check .

typecheck: install
	$(PY) -m mypy core/tessera operator/tessera_operator node-daemon/tessera_node sim/tessera_sim \
		e2e/tessera_e2e

# Regenerate crds/ from the API types (a test fails when they differ).
crds: install
	$(VENV)/bin/tessera crds --out crds

# Regenerate the chart's admission policies over tessera's pod keys from the table of who
# writes each key (core/tessera/api/writers.py; a test fails when they differ).
policies: install
	$(PY) -m tessera_operator.webhooks.policy > charts/tessera/templates/budget-protection.yaml

# Regenerate the device plugin's gRPC modules from their .proto files (a test fails when the
# committed ones are stale).
protos: install
	$(PY) -m tessera_node.protogen

# The simulated GPU node (fake libcuda, libnvidia-ml, nvidia-smi) and libtessera.
sim: install
	$(MAKE) -C sim PYTHON=$(CURDIR)/$(PY)

hook: install sim
	$(MAKE) -C hook PYTHON=$(CURDIR)/$(PY)

# kube-apiserver, etcd, kube-controller-manager, kube-scheduler, kubectl, kubelet, kube-proxy
# and containerd, built once from the Go module proxy into the cache (TESSERA_CACHE, default
# ~/.cache/tessera): the current Kubernetes release and the oldest one tessera supports.
controlplane: install
	$(PY) -m tessera_e2e build
	TESSERA_KUBERNETES=oldest $(PY) -m tessera_e2e build

# A local cluster for a person, with NODES real nodes; prints the KUBECONFIG to use.
NODES ?= 2
cluster: sysdeps controlplane sim
	$(PY) -m tessera_e2e cluster --nodes $(NODES)

# The nodes' OCI images (pause, workload) and tessera's (operator, node daemon: Debian
# packages + wheels + libtessera), built without Docker; prints their digests and sizes.
images: install sim hook
	$(PY) -m tessera_e2e images

# Regenerate the values table of charts/tessera/README.md (a test fails when it is stale).
chart-docs: install
	$(PY) -m tessera_e2e chart-docs

# The main job: the local demo.
demo: sysdeps controlplane sim hook
	$(PY) -m tessera_e2e demo

# Everything: lint, types, unit, simulator, hook and integration tests.
# Then the tests marked oldest_kubernetes again, on the oldest supported release.
test: sysdeps install lint typecheck sim hook controlplane
	$(PY) -m pytest
	TESSERA_KUBERNETES=oldest $(PY) -m pytest -m oldest_kubernetes -p no:cacheprovider

# The tests that need no control plane, no node and no built C (seconds).
unit: install sim
	$(PY) -m pytest core/tests operator/tests node-daemon/tests -m "not integration"

bench: sysdeps install sim hook controlplane
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) build .mypy_cache .ruff_cache .pytest_cache
	-$(MAKE) -C sim clean
	-$(MAKE) -C hook clean
