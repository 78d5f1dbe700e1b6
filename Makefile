# Two commands: `make run` (the main job) and `make test` (the test suite).
# Both create .venv when missing and re-install only when pyproject.toml changes.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
comma := ,
# The escnn oracle extra needs a Fortran compiler (py3nj); install it only where one exists.
EXTRAS := dev,data,qm9,gen,scanobjectnn,onnx$(if $(shell command -v gfortran 2>/dev/null),$(comma)oracle)
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))
# The suite runs in this many processes (pytest-xdist); one per core of the 2-core reference machine.
TEST_WORKERS ?= 2

.PHONY: run test install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	@rm -f $(VENV)/.installed-*
	@touch $@

run: $(STAMP)
	$(PY) -m eqvit train configs/so3vit_swe_demo.yaml --overwrite

test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS)

clean:
	rm -rf $(VENV) .pytest_cache
