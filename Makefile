# Two commands do all the set-up on a fresh machine with only Python on it:
#   make demo   installs into .venv (kernelforge only) and runs the main job
#   make test   installs into .venv (with the dev extra) and runs the test suite
PYTHON ?= python3
VENV ?= .venv
# The versions the CPU build was tested with (CPU_TRITON.md). pip's configured index decides the
# build: point it at PyTorch's CPU wheels on a machine without a GPU to skip the CUDA download.
TORCH_SPEC ?= torch==2.13.0
TRITON_SPEC ?= triton==3.9.0
# The GPU image's Triton (3.6): `make test-gpu-triton` runs every block's baseline and the
# conformance tests on it in the interpreter, so a version difference shows here, not on the GPU.
# Installed beside the venv's own Triton (a --target folder first on PYTHONPATH), not instead of it.
GPU_TRITON_SPEC ?= triton==3.6.0
GPU_TRITON := .triton-gpu-image
BIN := $(VENV)/bin
# Every install takes its versions from this lock file (pip -c), so two clones days apart get the
# same packages. `make lock` refreshes it; `make CONSTRAINTS= ...` installs without it (for
# example with another TORCH_SPEC).
CONSTRAINTS ?= constraints.txt
PIP_INSTALL = $(BIN)/pip install -q $(if $(CONSTRAINTS),-c $(CONSTRAINTS))

.PHONY: demo test test-gpu-triton test-all bench gpu-check gpu-check-dry wheels clean lock

# What the main job needs: kernelforge and its dependencies, no test tools or services.
$(BIN)/.installed: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) "$(TORCH_SPEC)" "$(TRITON_SPEC)"
	$(PIP_INSTALL) -e . "$(TORCH_SPEC)" "$(TRITON_SPEC)"
	touch $@

# The test suite's tools and services (pytest, Ray, PostgreSQL's driver, optuna-dashboard).
$(BIN)/.installed-dev: $(BIN)/.installed
	$(PIP_INSTALL) -e ".[dev]" "$(TORCH_SPEC)" "$(TRITON_SPEC)"
	touch $@

# The search ends with its summary and the report's path (reports/demo/REPORT.md, index.html).
demo: $(BIN)/.installed
	$(BIN)/kernelforge search search/demo.toml

# Refresh constraints.txt: the newest versions within pyproject.toml's bounds, in a scratch venv.
lock:
	rm -rf .lock-venv
	$(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install -q "$(TORCH_SPEC)" "$(TRITON_SPEC)"
	.lock-venv/bin/pip install -q -e ".[dev]" "$(TORCH_SPEC)" "$(TRITON_SPEC)"
	head -4 constraints.txt > .lock-venv/constraints.txt
	.lock-venv/bin/pip freeze --exclude-editable | sed -E 's/\+[A-Za-z0-9.]+$$//' >> .lock-venv/constraints.txt
	mv .lock-venv/constraints.txt constraints.txt
	rm -rf .lock-venv

# --durations: the 30 slowest tests close every run, so a CI log says where its time went.
test: $(BIN)/.installed-dev
	bash scripts/ensure_chromium.sh
	$(BIN)/python -m pytest -n 2 -q --durations=30

$(GPU_TRITON)/.installed: $(BIN)/.installed-dev
	rm -rf $(GPU_TRITON)
	$(BIN)/pip install -q --no-deps --no-compile --target $(GPU_TRITON) "$(GPU_TRITON_SPEC)"
	touch $@

test-gpu-triton: $(GPU_TRITON)/.installed
	PYTHONPATH=$(GPU_TRITON) $(BIN)/python -c "import triton; print('interpreter leg on triton', triton.__version__)"
	PYTHONPATH=$(GPU_TRITON) $(BIN)/python -m pytest -n 2 -q -p no:cacheprovider tests/kernels/test_conformance.py \
		tests/devices/test_interpreter_index.py tests/sandbox/test_sandbox_launcher.py

bench: $(BIN)/.installed-dev
	$(BIN)/python -m pytest benchmarks -q

# The mission proof on a GPU host (the GPU image's python3; docs/gpu.md). Prepare .whl/ first,
# where pip works: make wheels.
gpu-check:
	python3 scripts/gpu_check.py

# The same script in Triton's CPU interpreter on tiny shapes (CI runs it: .ci/run). Interpreter
# wall time, not GPU speed.
gpu-check-dry: $(BIN)/.installed-dev
	PYTHON=$(BIN)/python $(BIN)/python scripts/gpu_check.py --dry

wheels: $(BIN)/.installed-dev
	PYTHON=$(BIN)/python bash scripts/prepare_wheels.sh

clean:
	rm -rf $(VENV) $(GPU_TRITON) .pytest_cache .benchmarks
