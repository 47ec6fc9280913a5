VENV ?= .venv
STAMP := $(VENV)/.voxline-installed
HOST ?= 127.0.0.1
PORT ?= 8000
PYTEST_ARGS ?=

.PHONY: setup run test lint bench soak clean

$(STAMP): pyproject.toml scripts/setup.sh
	VENV=$(VENV) bash scripts/setup.sh
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/voxline serve --host $(HOST) --port $(PORT)

# The Qwen3-TTS parity tests run the official reference in its own cached venv; the
# third-party client tests (pipecat, openai-agents) run those clients in another; the
# remote-LLM tests start llama.cpp's server from a third (compiled once, then cached).
test: $(STAMP)
	bash scripts/test_deps.sh
	bash scripts/qwen_ref_venv.sh >/dev/null
	bash scripts/clients_venv.sh >/dev/null
	bash scripts/llama_server_venv.sh >/dev/null
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(VENV)/bin/python benchmarks/cpu_latency/bench_llm.py
	$(VENV)/bin/python benchmarks/cpu_latency/bench_pipeline.py

# Long reliability runs, not part of `make test`: the fault suite with idle sessions too,
# then SOAK_SESSIONS concurrent sessions for SOAK_MINUTES (model-free core; benchmarks/reliability/soak.py
# --real serves the shipped models): fails unless RSS, fds and threads return to baseline.
SOAK_SESSIONS ?= 200
SOAK_MINUTES ?= 10
soak: $(STAMP)
	VOXLINE_SOAK=1 $(VENV)/bin/python -m pytest tests/reliability $(PYTEST_ARGS)
	$(VENV)/bin/python benchmarks/reliability/soak.py --sessions $(SOAK_SESSIONS) --minutes $(SOAK_MINUTES)

clean:
	rm -rf $(VENV) .pytest_cache
