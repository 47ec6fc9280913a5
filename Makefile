VENV ?= .venv
STAMP := $(VENV)/.voxline-installed
HOST ?= 127.0.0.1
PORT ?= 8000
PYTEST_ARGS ?=

.PHONY: setup run test lint bench clean

$(STAMP): pyproject.toml scripts/setup.sh
	VENV=$(VENV) bash scripts/setup.sh
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/voxline serve --host $(HOST) --port $(PORT)

# The Qwen3-TTS parity tests run the official reference in its own cached venv; the
# third-party client tests (pipecat, openai-agents) run those clients in another.
test: $(STAMP)
	bash scripts/test_deps.sh
	bash scripts/qwen_ref_venv.sh >/dev/null
	bash scripts/clients_venv.sh >/dev/null
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(VENV)/bin/python benchmarks/bench_llm.py
	$(VENV)/bin/python benchmarks/bench_pipeline.py

clean:
	rm -rf $(VENV) .pytest_cache
