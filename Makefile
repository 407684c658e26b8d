# gpushare — every target sets up what it needs on a fresh machine.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON311 ?= $(shell for p in python3.11 /usr/bin/python3.11; do command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; print(sys.executable)' && break; done)
BOOT      := .bootstrap
UV        := $(BOOT)/bin/uv
VENV      := .venv
PY        := $(VENV)/bin/python
STAMP     := $(VENV)/.synced
APT_PKGS  := nats-server runc containerd openssl qemu-system-x86 linux-image-amd64 linux-headers-amd64 busybox-static cpio kmod gcc make libc6-dev libelf-dev chromium
SCENARIO  ?= all
# every image the chart and compose deploy: make images REGISTRY=registry.example.com/ TAG=0.1.0
SERVICE_IMAGES := detector solver deviceplugin kmod-bridge shadow-controller nats-auth console dra-driver
REGISTRY  ?=
TAG       ?= 0.1.0
PYTEST_ARGS ?=
ALONE = tests/bench/test_fleet.py::test_tiny_fleet_prints_every_figure
# four workers on two cores: most of a cluster test is waiting; a module's tests stay in one worker
PYTEST_XDIST ?= -n 4 --dist loadgroup --no-loadscope-reorder
# the tests' temporary files (pytest's tmp_path, the clusters', containerd's) on a tmpfs where there
# is one: creating a file there costs a twentieth of the disk's
TEST_TMPDIR ?= $(shell [ -d /dev/shm ] && [ -w /dev/shm ] && echo /dev/shm || echo /tmp)

export UV_PYTHON := $(PYTHON311)
export UV_PROJECT_ENVIRONMENT := $(VENV)
# the environment's files hard-linked from uv's cache (2 s) rather than copied (10-30 s); where the
# cache is on another file system uv copies them itself. Nothing writes into an installed package.
export UV_LINK_MODE ?= hardlink
# Python keeps each module's compiled form in __pycache__ (ignored by git), and pytest its rewritten
# test modules: a test run starts hundreds of Python processes (services, runtimes, four workers),
# each of which would otherwise compile the same sources again
unexport PYTHONDONTWRITEBYTECODE

.PHONY: help run test lint bench deps venv protos system clean tools kmod soak manifests images push-images

help:
	@echo "make run   - start the local cluster, every service and the scenarios (SCENARIO=name, ARGS=--keep)"
	@echo "make test  - install what is missing, then run the whole test suite"
	@echo "make lint  - ruff, mypy --strict, import-linter, one way for each thing (tests/lint)"
	@echo "make bench - every benchmark, one table, bench/results.json"
	@echo "make soak  - a chaos soak of the local cluster (MINUTES=5, ARGS=\"--seed S --nodes K --nats-cluster 3\")"
	@echo "             PROFILE=calm|nats-member|nats-outage|apiserver [BORROWERS=slow]: the README's runs"
	@echo "make manifests - render k8s/base and the kmod component from the Helm chart k8s/chart/gpushare"
	@echo "make images [REGISTRY=host/ TAG=0.1.0] - build every image the chart and compose deploy (docker)"
	@echo "make push-images [REGISTRY=host/ TAG=0.1.0] - build them, then push them to REGISTRY"

$(UV):
	@test -n "$(PYTHON311)" || { echo "error: Python 3.11 is required (python3.11 not found on PATH)"; exit 1; }
	$(PYTHON311) -m venv $(BOOT)
	$(BOOT)/bin/pip install --quiet --disable-pip-version-check 'uv>=0.5'

$(STAMP): $(UV) uv.lock pyproject.toml libs/common/pyproject.toml $(wildcard services/*/pyproject.toml) runtime/pyproject.toml sim/pyproject.toml
	$(UV) sync --frozen --all-packages
	@touch $(STAMP)

uv.lock: | $(UV)
	$(UV) lock

RUNTIME_BIN := $(VENV)/bin/gpushare-runtime
$(RUNTIME_BIN): $(STAMP) runtime/install/install.sh runtime/install/launcher.sh.in
	runtime/install/install.sh $(VENV)/bin $(abspath $(PY))

venv: $(STAMP) protos $(RUNTIME_BIN)

# gRPC stubs are generated from the .proto files at build time, never committed.
PROTOS := $(wildcard libs/common/proto/*.proto)
PROTO_OUT := libs/common/gpushare_common/adapters/kubeletapi
protos: $(STAMP)
	@mkdir -p $(PROTO_OUT)
	@if [ -n "$(PROTOS)" ]; then $(PY) -m grpc_tools.protoc -Ilibs/common/proto --python_out=$(PROTO_OUT) --pyi_out=$(PROTO_OUT) --grpc_python_out=$(PROTO_OUT) $(PROTOS) && sed -i -E 's/^import (\w+_pb2)/from . import \1/' $(PROTO_OUT)/*_pb2*.py; fi

# System packages the tests and the local cluster use (Debian). Installs only what is missing.
system:
	@missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  if [ "$$(id -u)" != 0 ]; then echo "error: need root to apt-get install$$missing"; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

# Native helpers: the simulated GPU workload (static, runs inside busybox containers).
tools: system
	@$(MAKE) -s -C sim/tools

# The owner-back kernel module, built against the Debian kernel the VM tests boot.
kmod: system
	$(MAKE) -C kmod

deps: system venv tools

test: deps
	$(PY) -m compileall -q -j 0 libs services sim runtime bench tests >/dev/null
	TMPDIR=$(TEST_TMPDIR) $(PY) -m pytest $(PYTEST_XDIST) $(PYTEST_ARGS) --deselect $(ALONE)
	# the fleet benchmark measures CPU and latency of a real node: alone, not beside three workers
	TMPDIR=$(TEST_TMPDIR) $(PY) -m pytest $(PYTEST_ARGS) $(ALONE)

lint: venv
	$(PY) -m ruff check .
	$(PY) -m mypy libs/common/gpushare_common runtime/gpushare_runtime services/*/gpushare_* sim/gpushare_sim
	$(VENV)/bin/lint-imports
	$(PY) -m tests.lint.one_way

bench: deps
	$(PY) -m bench $(BENCH_ARGS)

# k8s/base and k8s/components/kmod are the chart rendered with a real helm (tests/deploy/test_chart.py checks).
manifests: venv
	$(PY) -m tests.deploy.chart --write

run: deps
	$(PY) -m gpushare_sim.run --scenario $(SCENARIO) $(ARGS)

# A chaos soak: real services, a seeded schedule of pods, owner-backs and faults, invariants checked.
# PROFILE=calm|nats-member|nats-outage|apiserver runs one of the README's runs (BORROWERS=slow: slow
# borrowers); its table names the date and the commit.
MINUTES ?= 5
PROFILE ?=
BORROWERS ?= ordinary
soak: deps
ifeq ($(PROFILE),)
	$(PY) -m gpushare_sim.soak --minutes $(MINUTES) $(ARGS)
else
	$(PY) -m gpushare_sim.soak --profile $(PROFILE) --borrowers $(BORROWERS) $(ARGS)
endif

clean:
	rm -rf $(VENV) $(BOOT) .mypy_cache .ruff_cache .pytest_cache

# Dockerfile=image name, for every image
IMAGE_FILES := $(foreach s,$(SERVICE_IMAGES),services/$(s)/Dockerfile=$(s)) \
	k8s/node-installer.Dockerfile=node-installer kmod/Dockerfile=kmod-installer
image_file = $(word 1,$(subst =, ,$(1)))
image_name = $(REGISTRY)gpushare/$(word 2,$(subst =, ,$(1))):$(TAG)

images:
	$(foreach i,$(IMAGE_FILES),docker build -f $(call image_file,$(i)) -t $(call image_name,$(i)) . && ) true

push-images: images
	$(foreach i,$(IMAGE_FILES),docker push $(call image_name,$(i)) && ) true
