# `make run` starts the console; `make test` runs every test. Both install what is missing first.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
# What the console and its local cluster need from Debian: Redis, OpenSSH, namespaces and bridges
# (iproute2, util-linux), Podman with runc (Debian's crun refuses this kernel's hybrid cgroups) for the
# workers' containers, nftables for each job's network policy on its nodes, debootstrap to build the engine images, Open MPI and mpi4py for the bare-mpirun
# benchmarks, gettext for the translations, Chromium for the browser tests, shellcheck for `make check`,
# cmake and g++ (with libopenmpi-dev, python3-dev) for the Horovod wheel the Horovod engine image is built with;
# Slurm with munge, its REST server, JWT and MySQL plugins, and the MariaDB client, for the local Slurm
# (`manage.py localslurm`; its accounting runs on the machine's MariaDB server, at 127.0.0.1:3306); uidmap (newuidmap)
# for the rootless Podman of a Slurm pool without root; docker-registry (the CNCF distribution server) for the
# console's image registry, from which nodes pull only the image layers they lack.
APT_PACKAGES := redis-server openmpi-bin libopenmpi-dev openssh-server openssh-client iproute2 util-linux procps \
	python3 python3-venv python3-dev python3-mpi4py python3-numpy gettext chromium shellcheck \
	podman runc uidmap nftables debootstrap cmake g++ \
	munge slurm-wlm slurmctld slurmd slurmdbd slurmrestd slurm-wlm-jwt-plugin slurm-wlm-mysql-plugin mariadb-client \
	docker-registry

.PHONY: run test unit-test system-packages venv messages check images clean

system-packages:
	@missing=$$(for package in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}' $$package 2>/dev/null | grep -q 'ok installed' || echo $$package; done); \
	if [ -n "$$missing" ]; then \
		echo "installing:" $$missing; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
		if echo "$$missing" | grep -qx docker-registry; then \
			echo "the packaged registry service (port 5000, all addresses) is not the console's: disabling it"; \
			systemctl disable --now docker-registry >/dev/null 2>&1 || true; \
		fi; \
	fi

$(VENV)/.installed: requirements.txt requirements-dev.txt
	@test -x $(PY) || /usr/bin/python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt -r requirements-dev.txt
	@touch $@

venv: system-packages $(VENV)/.installed

messages: venv
	@$(PY) manage.py compilemessages --ignore=$(VENV) -v 0

# The shipped engine images (MPI, Horovod, MindSpore), built once per machine and cached by their recipe's hash.
images: venv
	$(PY) manage.py buildimages

# `make run SLURM=1` also brings up a local Slurm on nodes of its own (see README, "Slurm").
run: venv messages images
	@if [ -n "$(SLURM)" ]; then $(PY) manage.py migrate -v 0 && $(PY) manage.py localslurm up; fi
	$(PY) manage.py runconsole

# The guard rails: Django's checks, no missing migration, lint, types (mypy.ini keeps today's baseline),
# the layers (.importlinter) and the node scripts.
check: venv
	$(PY) manage.py check
	CONSOLE_HTTPS=1 ALLOWED_HOSTS=console.example.org SECRET_KEY=$$($(PY) -c 'import secrets; print(secrets.token_urlsafe(50))') $(PY) manage.py check --deploy --fail-level WARNING
	$(PY) manage.py makemigrations --check --dry-run
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy jobs nccl console manage.py
	PYTHONPATH=. $(VENV)/bin/lint-imports
	shellcheck jobs/runtime/node_scripts/*.sh
	$(PY) manage.py spectacular --validate --fail-on-warn --file /dev/null

# With POSTGRES_TEST_URL set (CI sets it), the tests that depend on the database's locking and
# transactions run a second time on PostgreSQL; the 50-job concurrent allocation test runs only there.
PG_TESTS := tests/unit tests/integration/test_pipeline.py tests/integration/test_concurrent_allocation.py \
	tests/integration/test_log_streaming.py

# The browser tests run in a pytest of their own: Playwright's sync API keeps an event loop running
# in the test thread, and the SSH code the other tests drive starts its own with asyncio.run().
test: venv messages check images
	$(PY) -m pytest tests/unit tests/integration tests/security
	$(PY) -m pytest tests/browser
	@if [ -n "$$POSTGRES_TEST_URL" ]; then \
		echo "=== the same on PostgreSQL: $(PG_TESTS)"; \
		DATABASE_URL="$$POSTGRES_TEST_URL" TEST_RUN_ID=2 $(PY) -m pytest $(PG_TESTS); \
	else \
		echo "POSTGRES_TEST_URL is not set: the PostgreSQL pass (and its concurrent allocation test) was skipped"; \
	fi

unit-test: venv messages
	$(PY) -m pytest tests/unit

clean:
	rm -rf var test-output .pytest_cache
