# Two commands for a fresh machine:  make demo  (install + convert/run an example)  |  make test  (make test-slow: the slow lane)
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS := tf,xla,test,beam,serve
# The tests' references for Keras 2 models and TF Serving's messages. Both declare the full `tensorflow` wheel
# (CUDA included) as a dependency, which pip would install over tensorflow-cpu's files: installed without their
# dependencies (they need only TensorFlow, protobuf and grpcio, which the extras bring), so the venv has one TensorFlow.
NO_DEPS := "tf-keras==2.21.*" "tensorflow-serving-api==2.21.*"

.PHONY: demo test test-slow install bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[$(EXTRAS)]"
	$(BIN)/pip install -q --no-deps $(NO_DEPS)
	@# a venv made before NO_DEPS may hold the full tensorflow wheel over tensorflow-cpu: back to one TensorFlow
	if $(BIN)/pip show -q tensorflow 2>/dev/null; then \
	  $(BIN)/pip uninstall -q -y tensorflow && $(BIN)/pip install -q --force-reinstall --no-deps "tensorflow-cpu==2.21.*"; fi
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
