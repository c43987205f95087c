# `make demo` and `make test` each create .venv when it is missing and install clip-dcl into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# torch pinned to the build available offline on our machines; override with TORCH_PIN= to skip.
TORCH_PIN ?= torch==2.14.1 torchvision==0.29.1
PYTEST_ARGS ?=
# pytest-xdist workers, three for two cores and at most 8 (many tests wait on processes they start, so more
# workers than cores finish sooner; each worker also collects the suite and imports torch: on 2 cores, 3 workers
# beat 4); `make test PYTEST_WORKERS=0` runs the suite in one process. A test module runs on one worker,
# so its module fixtures (a torchrun launch, a trained checkpoint) run once.
PYTEST_WORKERS ?= $(or $(shell nproc 2>/dev/null | awk '{n = int(1.5 * $$1); print (n > 8 ? 8 : n)}'),auto)

.PHONY: test test-quick test-upstream lint demo venv clean

# One line a step says what is being installed; pip itself stays quiet.
$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || { echo "[make] creating $(VENV) with $(PYTHON)" && $(PYTHON) -m venv $(VENV); }
	@echo "[make] updating pip in $(VENV)"
	@$(PY) -m pip install -q --upgrade pip
	$(if $(TORCH_PIN),@echo "[make] installing $(TORCH_PIN) (the largest download)")
	$(if $(TORCH_PIN),@$(PY) -m pip install -q $(TORCH_PIN))
	@echo "[make] installing clip-dcl and its dependencies (open_clip_torch, webdataset, ...; pytest and ruff for make test)"
	@$(PY) -m pip install -q -e '.[dev]' $(TORCH_PIN)
	@touch $@
	@echo "[make] $(VENV) is ready"

venv: $(VENV)/.installed

# ruff (pyproject.toml's [tool.ruff]): the lint rules and the formatter's check; `make test` runs it first
lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

test: lint
	$(PY) -m pytest tests -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15 $(PYTEST_ARGS)

test-quick: venv
	$(PY) -m pytest tests -m "not slow" -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The oldest OpenCLIP clip-dcl supports, in a folder of its own whose packages come before .venv's
# (PYTHONPATH): the training, checkpoint and export tests run again with it.
UPSTREAM_OPENCLIP ?= open_clip_torch==2.32.0
UPSTREAM := .venv-upstream
UPSTREAM_TESTS ?= tests/test_openclip_release.py tests/test_checkpoint.py tests/test_train.py tests/test_train_reliability.py

$(UPSTREAM)/.installed: $(VENV)/.installed
	@echo "[make] installing $(UPSTREAM_OPENCLIP) into $(UPSTREAM) (it shadows .venv's OpenCLIP for make test-upstream)"
	@$(PY) -m pip install -q --no-deps --target $(UPSTREAM) $(UPSTREAM_OPENCLIP)
	@touch $@

test-upstream: $(UPSTREAM)/.installed
	PYTHONPATH=$(CURDIR)/$(UPSTREAM) CLIP_DCL_EXPECT_OPENCLIP=$(subst open_clip_torch==,,$(UPSTREAM_OPENCLIP)) \
		$(PY) -m pytest $(UPSTREAM_TESTS) -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

demo: venv
	$(VENV)/bin/clip-dcl demo $(DEMO_ARGS)

clean:
	rm -rf $(VENV) $(UPSTREAM) build *.egg-info
