# Metered API Gateway — developer commands. See README.md.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
PORT    ?= 8000
export PORT

.PHONY: help venv run serve test fuzz fault migrate clean screenshots

help:
	@echo "make run    - install into .venv, migrate, load the demo catalog, serve on http://127.0.0.1:$(PORT)"
	@echo "make test   - run the whole test suite on PostgreSQL: DATABASE_URL when set, else a throw-away embedded one (REDIS_URL honoured when set), in parallel workers (TEST_WORKERS)"
	@echo "make fuzz   - schemathesis (all checks, two accounts) against a throw-away instance"
	@echo "make fault  - money under fault: worker kills, upstream hangs, Redis and PostgreSQL outages, x402 settle faults, racing auto top-ups, a payout worker killed before booking, webhooks replayed around a killed booking, a USDC payout under chain faults and a kill"
	@echo "make serve  - production stack on loopback: nginx :8080/:8081, gunicorn, RQ worker, scheduler (PostgreSQL + Redis)"
	@echo "make screenshots - every console page at 1280 and 390 px in Chromium -> docs/console/*.png"
	@echo "make bench  - load benchmark on loopback (bench/run.py) -> bench/results/latest.{json,md}"

$(BIN)/activate:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

CLIENT_SRC := $(shell find clients/python -name '*.py' -path '*/src/*') clients/python/pyproject.toml

$(VENV)/.installed: requirements.txt requirements-dev.txt requirements-nodeps.txt $(CLIENT_SRC) | $(BIN)/activate
	$(BIN)/pip install -q -r requirements-dev.txt
	$(BIN)/pip install -q --no-deps -r requirements-nodeps.txt
	touch $@

venv: $(VENV)/.installed

migrate: venv
	$(BIN)/flask --app wsgi db upgrade

run: venv
	@bash deploy/run-local.sh

serve: venv
	@bash deploy/serve.sh

# Parallel workers (pytest-xdist): one more than the CPUs, at most 4 (tests/conftest.py); each has its
# own database and Redis index (tests/support/workers.py). TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= auto
# axe-core for the console's accessibility check (npm, pinned by tests/e2e/axe/package-lock.json)
AXE := tests/e2e/axe/node_modules/axe-core/axe.min.js
$(AXE): tests/e2e/axe/package.json tests/e2e/axe/package-lock.json
	bash tests/e2e/axe/install.sh
	touch $@

test: venv $(AXE)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# The console's screenshots (docs/console.md): Chromium against gunicorn on the test database
# (DATABASE_URL when set, else the embedded one), written to docs/console/.
screenshots: venv $(AXE)
	bash deploy/system-packages.sh
	CONSOLE_SCREENSHOTS=docs $(BIN)/python -m pytest -q -n 0 tests/e2e/test_console_screenshots.py

fuzz: venv
	$(BIN)/python -m tests.fuzz.run_fuzz --max-examples $${FUZZ_EXAMPLES:-100}

fault: venv
	$(BIN)/python -m tests.fault.money_under_fault --seconds $${FAULT_SECONDS:-30} --clients 8 \
		--faults kill,upstream,redis,postgres,x402hang,x402kill,finalizekill,topuprace,payoutkill,webhookreplay,usdcpayout

# Load benchmark (never part of `make test`): see README "Performance" and bench/run.py.
.PHONY: bench
bench: venv
	bash deploy/system-packages.sh
	$(BIN)/python bench/run.py

clean:
	-[ ! -x $(BIN)/python ] || $(BIN)/python -m app.services.platform.embedded_pg stop
	rm -rf $(VENV) instance .pytest_cache
