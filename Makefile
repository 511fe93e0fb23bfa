# Two commands for a fresh machine:  make demo  (install + convert/run an example)  |  make test  (make test-slow: the slow lane)
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow install bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[tf,xla,test,beam,serve]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m kiln.demo

test: $(STAMP)
	bash .ci/test -m "not slow"

# whole-model cases (ImageNet-size zoos, full quantization conformance): CI runs them after `make test`
test-slow: $(STAMP)
	bash .ci/test -m slow

bench: $(STAMP)
	for b in bench/*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
