# order-timeout: the commands a developer and CI run. `.ci/run` calls `make test`.
#
#   make run     start the service on its defaults (SQLite file here, local broker)
#   make demo    watch orders being paid and cancelled live (a local RabbitMQ: rabbitmqctl, management API on 15672)
#   make check   the inner loop, minutes: lint, the unit tests (no service needed) and the SQLite ttl
#                variants of the integration suite (RabbitMQ only) (docs/development.md)
#   make test    lint, unit and integration tests against the real services: the whole suite
#   make test-broker TEST_BROKER=amqp://… TEST_MANAGEMENT=http://…/api
#                the core scenarios, stages, pause and resume, and publisher examples against another broker
#                (CI: RabbitMQ 4.0.5, and 4.3.6 where the native delay mode runs and the plugin cannot)
#   make lint    rustfmt and clippy, warnings denied; the docs' relative links
#   make services  start whatever local service is down (RabbitMQ, PostgreSQL, MariaDB)
#   make cluster   start a local three-node RabbitMQ cluster, ports 5681-5683 (scripts/cluster.sh);
#                  RABBITMQ_ROOT=/srv/rabbitmq43 for RabbitMQ 4.3 (also for test-cluster)
#   make cluster-stop  stop that cluster and remove its data
#   make test-cluster  the service on that cluster losing a node mid-run, then the ledger (docs/RELIABILITY.md)
#   make chaos   minutes of injected faults, then a ledger check (docs/RELIABILITY.md)
#   make bench   burst, steady load, checkout and the machine's ceiling, and what tracing costs against
#                TRACING_BASELINE (v0.1.0, built first; empty skips it) (docs/BENCHMARKS.md)
#   make bench-million  a million pending timers (native where the broker has it, else ttl): memory and scheduling time
#                On RabbitMQ 4.3 (AMQP on 5677, management on 15677 here), name that broker and the mode:
#                make bench BENCH_ARGS="--mode native --amqp amqp://guest:guest@127.0.0.1:5677 --management http://guest:guest@127.0.0.1:15677/api"
#                (--mode ttl for ttl mode there; the same BENCH_ARGS for make bench-million)
#   make test-upgrade  the previous release (UPGRADE_FROM, built by scripts/previous-release.sh) and this
#                version side by side on one database and vhost while timers come due (UPGRADING.md)
#   make dist    target/dist/order-timeout_<version>_amd64.deb: binary, config, systemd unit (packaging/)
#   make test-dist  install that package here (root), run it as its unit would, then purge it
#   make image   target/image/order-timeout-<version>.oci.tar and order-timeout:<version> in the local
#                containers storage: an OCI image built here from scratch with buildah (docs/deploying.md)
#   make test-image  that image's contents, then the image under podman against the local broker and PostgreSQL
#   make test-manifests  the Kubernetes manifests (deploy/kubernetes) against the settings table and the real binary
#   make test-ui  the operator's page /ui in headless Chromium (Debian's, driven by Playwright) against the release
#                binary, in ttl and plugin mode; UI_TEST_ARGS="--screenshot docs/images/ui.png" renews the docs' picture

SHELL := /bin/bash
CARGO ?= cargo
VENV := .venv
PYTHON := $(VENV)/bin/python
# Integration tests mostly wait for deadlines to pass, so many run at once;
# more than 8 on two cores starve the broker's management API and the
# database pools, and timing-bound tests then fail for want of CPU.
TEST_THREADS ?= 8

.PHONY: run check test test-upgrade test-broker lint services broker databases examples-deps tools clean bench bench-million bench-checkout-ceiling chaos demo cluster cluster-stop test-cluster dist test-dist test-alerts image image-tools test-image test-manifests browser test-ui

# Built as make test builds it (the whole workspace's features), so that
# neither rebuilds the other.
run: broker
	$(CARGO) build $(RELEASE) && target/release/order-timeout serve

# A live demo: a few orders on a temporary database, the unpaid cancelled at their deadlines.
demo: broker
	$(CARGO) build $(RELEASE) && target/release/order-timeout demo

# Plugin-mode tests skip, saying why, on a broker without the delayed-message
# plugin; with ORDER_TIMEOUT_REQUIRE_PLUGIN set (CI) they fail instead.
# A failed test prints the service's warnings and its transitions (captured,
# shown only for a test that fails): enough to tell a late delivery from a
# slow database.
TEST_LOG ?= warn,order_timeout=info
# One build for everything: the release profile and the whole workspace's
# features, for the tests as for the binary they spawn, the package, the image
# and the page; a narrower selection (-p, or the dev profile) would compile
# the dependencies again with other features.
RELEASE := --release --locked --workspace
TEST_ENV := ORDER_TIMEOUT_REQUIRE_EXAMPLES=1 ORDER_TIMEOUT_TEST_PYTHON=$(abspath $(PYTHON)) TEST_LOG=$(TEST_LOG)

# The delayed-message plugin keeps its timers on the broker's node, not in the
# vhost: after a run (whatever its outcome), the timers of the test vhosts it
# deleted are removed (harness/src/delayed.rs), so nothing is left behind.
FORGET_DELAYED = $(CARGO) build -q $(RELEASE) --bin forget-delayed && target/release/forget-delayed ot-test-
# Runs a command, then a sweep; fails with the command's status, or the sweep's.
define and_forget
$(1); s=$$?; $(2) || exit 1; exit $$s
endef

test: services examples-deps tools lint
	$(MAKE) test-alerts
	@# The previous release first (it shares target/release with this tree's
	@# two crates): then this tree is built once, and nothing rebuilds it.
	bash scripts/previous-release.sh $(UPGRADE_FROM)
	$(CARGO) build $(RELEASE)
	$(call and_forget,$(TEST_ENV) $(CARGO) test $(RELEASE) -- --test-threads=$(TEST_THREADS),$(FORGET_DELAYED))
	@# The unit tests that need PostgreSQL or MariaDB (ignored by the unit tier, make check).
	$(CARGO) test $(RELEASE) --lib -- --ignored
	@# These restart the broker application: alone, after everything else.
	$(call and_forget,$(TEST_ENV) $(CARGO) test $(RELEASE) --test api -- --ignored --test-threads=1 broker_restart,$(FORGET_DELAYED))
	@# These set MariaDB's server-wide default time zone: alone too.
	$(call and_forget,$(TEST_ENV) $(CARGO) test $(RELEASE) --test api -- --ignored --test-threads=1 server_zone,$(FORGET_DELAYED))
	@# The previous release beside this one (built first, above).
	$(MAKE) test-upgrade
	bash scripts/readme-example.sh ttl plugin
	$(MAKE) test-dist
	$(MAKE) test-manifests test-image
	$(MAKE) test-ui

# A rolling upgrade: the release UPGRADE_FROM (a tag; a clone without tags
# finds its commit in packaging/releases) is built in a git worktree under
# target/upgrade/ sharing target/ (scripts/previous-release.sh), then runs
# beside this version on one PostgreSQL database and vhost, in ttl and plugin
# mode, while timers come due (tests/api/upgrade.rs).
UPGRADE_FROM ?= v0.1.0
test-upgrade: services
	bash scripts/previous-release.sh $(UPGRADE_FROM)
	$(call and_forget,ORDER_TIMEOUT_PREVIOUS_BIN=$(abspath target/upgrade/order-timeout-$(subst /,_,$(UPGRADE_FROM))) $(TEST_ENV) \
		$(CARGO) test $(RELEASE) --test api -- --ignored --test-threads=2 upgrade::,$(FORGET_DELAYED))

# The same workspace build as `make test`, so neither rebuilds the other's
# dependencies with different features.
dist:
	$(CARGO) build $(RELEASE)
	bash scripts/dist.sh

test-dist: dist
	bash scripts/dist-test.sh target/dist/order-timeout_*.deb

# The image from the same release build, no base image pulled (scripts/image.sh).
image: image-tools
	$(CARGO) build $(RELEASE)
	bash scripts/image.sh

# podman runs containers with runc: crun refuses a hybrid cgroup hierarchy.
# skopeo and umoci read the OCI archive for the image's test.
image-tools:
	@(command -v buildah && command -v podman && command -v skopeo && command -v umoci && command -v runc) >/dev/null \
		|| (apt-get update -qq && apt-get install -y -qq -o DPkg::Lock::Timeout=600 buildah podman skopeo umoci runc)

test-image: image broker databases
	bash scripts/image-test.sh target/image/order-timeout-*.oci.tar

# The manifests' settings, commands, ports and probes checked with the release
# binary against a database and vhost of their own (scripts/manifest-test.py).
test-manifests: $(VENV)/.installed broker databases
	$(CARGO) build $(RELEASE)
	$(PYTHON) scripts/manifest-test.py

# The page in a real browser: Debian's Chromium, headless, driven by
# Playwright from the venv (which never downloads a browser of its own), on a
# database and vhost of its own per delay mode, and once in shadow mode on a
# shop's table (scripts/ui-test.py). The screenshots go to target/ui-test/
# unless UI_TEST_ARGS says otherwise.
UI_TEST_ARGS ?=
test-ui: $(VENV)/.installed browser broker databases
	$(CARGO) build $(RELEASE)
	$(call and_forget,$(PYTHON) scripts/ui-test.py $(UI_TEST_ARGS),$(FORGET_DELAYED))

browser:
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq -o DPkg::Lock::Timeout=600 chromium)

# Another broker (RabbitMQ 4.0 or 4.3, say): the core scenarios in every delay
# mode, the publisher examples, and every native-mode test (`native` in its
# name), since only another broker can run them. Native-mode tests skip,
# saying why, before RabbitMQ 4.3 (with ORDER_TIMEOUT_REQUIRE_NATIVE set they
# fail instead); plugin-mode tests skip where the plugin is not enabled (it
# cannot be on 4.3).
# TEST_RABBITMQCTL reaches that
# broker's node, to remove the plugin timers the tests leave there
# (`rabbitmqctl -n NODE`, say); without it they stay until they come due. A
# node without the plugin, 4.3 included, has none: the sweep finds nothing.
TEST_BROKER ?= amqp://guest:guest@127.0.0.1:5672
TEST_MANAGEMENT ?= http://127.0.0.1:15672/api
TEST_RABBITMQCTL ?=
test-broker: databases examples-deps
	$(call and_forget,ORDER_TIMEOUT_TEST_BROKER=$(TEST_BROKER) ORDER_TIMEOUT_TEST_MANAGEMENT=$(TEST_MANAGEMENT) \
		$(if $(TEST_RABBITMQCTL),ORDER_TIMEOUT_TEST_RABBITMQCTL="$(TEST_RABBITMQCTL)") $(TEST_ENV) \
		$(CARGO) test $(RELEASE) --test api -- --test-threads=$(TEST_THREADS) \
		core:: examples:: stages:: control:: native,$(if $(TEST_RABBITMQCTL),$(FORGET_DELAYED) $(TEST_RABBITMQCTL),echo "plugin timers of deleted test vhosts left on the broker of $(TEST_MANAGEMENT): TEST_RABBITMQCTL not set"))
	@# The bench at a tiny size in native mode on that broker (skipped, saying why, where it has none).
	ORDER_TIMEOUT_TEST_BROKER=$(TEST_BROKER) ORDER_TIMEOUT_TEST_MANAGEMENT=$(TEST_MANAGEMENT) \
		$(CARGO) test $(RELEASE) --test small_run -- --test-threads=1 native
	@# The native stage through a broker restart (rabbitmqctl stop_app, start_app): alone, after the rest.
	$(if $(TEST_RABBITMQCTL),ORDER_TIMEOUT_TEST_BROKER=$(TEST_BROKER) ORDER_TIMEOUT_TEST_MANAGEMENT=$(TEST_MANAGEMENT) \
		ORDER_TIMEOUT_TEST_RABBITMQCTL="$(TEST_RABBITMQCTL)" $(TEST_ENV) \
		$(CARGO) test $(RELEASE) --test api -- --ignored --test-threads=1 broker_restart_native)

# The inner loop (docs/development.md): rustfmt, clippy, the unit tests (none
# needs a service: those on PostgreSQL or MariaDB are ignored here, make test
# runs them) and the integration suite's SQLite ttl variants, which need
# RabbitMQ alone. Same profile as make test: neither rebuilds the other.
check: broker lint
	$(CARGO) test $(RELEASE) --lib --bins
	TEST_LOG=$(TEST_LOG) $(CARGO) test $(RELEASE) --test api -- --test-threads=$(TEST_THREADS) sqlite_ttl

lint:
	python3 scripts/doc-links.py
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --locked --workspace --all-targets -- -D warnings

services: broker databases

# RabbitMQ, with the management plugin (its HTTP API on 15672 is how tests make
# vhosts and inspect queues, and how the service counts the plugin's timers).
# The delayed-message plugin is enabled when the broker has it (install it as
# rabbitmq/README.md says); without it plugin-mode tests say they are skipped.
broker:
	@if ! rabbitmqctl -q status >/dev/null 2>&1; then \
		echo "starting RabbitMQ"; rabbitmq-server -detached; fi
	@rabbitmqctl -q await_startup --timeout 120
	@rabbitmq-plugins -q is_enabled rabbitmq_management >/dev/null 2>&1 || rabbitmq-plugins -q enable rabbitmq_management
	@if rabbitmq-plugins -q list -m | grep -qx rabbitmq_delayed_message_exchange; then \
		rabbitmq-plugins -q enable rabbitmq_delayed_message_exchange; fi
	@for i in $$(seq 1 60); do \
		curl -sf -u guest:guest http://127.0.0.1:15672/api/overview >/dev/null && exit 0; sleep 1; done; \
		echo "RabbitMQ management API did not come up on 15672"; exit 1

databases:
	@if ! pg_isready -q -h 127.0.0.1 -p 5432; then \
		echo "starting PostgreSQL"; pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql | head -n1) main start; fi
	@for i in $$(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done; pg_isready -h 127.0.0.1 -p 5432
	@if ! mariadb-admin -uroot ping >/dev/null 2>&1; then \
		echo "starting MariaDB"; start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd; fi
	@for i in $$(seq 1 30); do mariadb-admin -uroot ping >/dev/null 2>&1 && break; sleep 1; done; mariadb-admin -uroot ping
	@# Named zones (mapping.time_zone = "Europe/Berlin") need MariaDB's time zone tables.
	@[ "$$(mariadb -uroot -N -e 'SELECT COUNT(*) FROM mysql.time_zone_name')" != 0 ] \
		|| (echo "loading MariaDB's time zone tables"; mariadb-tzinfo-to-sql /usr/share/zoneinfo 2>/dev/null | mariadb -uroot mysql)

# Three RabbitMQ nodes clustered beside the main broker (AMQP 5681-5683,
# management 15681-15683); the main broker is left alone. RABBITMQ_ROOT picks
# the installation: empty for the machine's own (3.10), /srv/rabbitmq43 for
# RabbitMQ 4.3 in the chroot of ../shared/rabbitmq43/start.sh (its node on 5677
# is left alone too). One cluster at a time: cluster-stop stops whichever runs.
RABBITMQ_ROOT ?=
CLUSTER_SH := OT_CLUSTER_ROOT=$(RABBITMQ_ROOT) bash scripts/cluster.sh
cluster:
	$(CLUSTER_SH) start

cluster-stop:
	$(CLUSTER_SH) stop

# Minutes long: the cluster is started, each phase loses a node (the phases of
# a delay mode the broker cannot run say so and are skipped), and the cluster
# is removed again whatever the outcome.
test-cluster: databases cluster
	$(call and_forget,OT_CLUSTER_ROOT=$(RABBITMQ_ROOT) $(CARGO) test $(RELEASE) --test cluster -- --ignored --nocapture,$(CLUSTER_SH) stop)

# socat terminates TLS in front of the broker for the amqps:// test.
tools:
	@command -v socat >/dev/null || (apt-get update -qq && apt-get install -y -qq socat)
	@command -v openssl >/dev/null || (apt-get update -qq && apt-get install -y -qq openssl)
	@# libfaketime runs a second instance with its clock ahead (tests/api/clocks.rs).
	@command -v faketime >/dev/null || (apt-get update -qq && apt-get install -y -qq faketime)
	@# promtool comes with Prometheus; the server the package would start is not wanted here.
	@command -v promtool >/dev/null || (apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus \
		&& (systemctl disable --now prometheus 2>/dev/null || true))

# The alert rules are valid, and each fires on its condition and only then.
test-alerts: tools
	promtool check rules rabbitmq/prometheus/alerts.yml
	cd rabbitmq/prometheus && promtool test rules alerts_test.yml

# Client libraries of the publisher examples: pika and amqplib from their
# registries, each redone only when its lock or requirements file changes; Go,
# Java and PHP with their AMQP clients from Debian, installed only when missing.
NODE_EXAMPLE := rabbitmq/examples/node
EXAMPLE_PACKAGES := golang-go golang-github-rabbitmq-amqp091-go-dev default-jdk-headless librabbitmq-client-java php-cli php-amqplib
examples-deps: $(VENV)/.installed $(NODE_EXAMPLE)/node_modules/.installed
	@(command -v go && test -d /usr/share/gocode/src/github.com/rabbitmq/amqp091-go \
		&& command -v javac && test -f /usr/share/java/amqp-client.jar \
		&& command -v php && test -f /usr/share/php/PhpAmqpLib/autoload.php) >/dev/null \
		|| (apt-get update -qq && apt-get install -y -qq $(EXAMPLE_PACKAGES))

$(NODE_EXAMPLE)/node_modules/.installed: $(NODE_EXAMPLE)/package.json $(NODE_EXAMPLE)/package-lock.json
	npm ci --prefix $(NODE_EXAMPLE) --no-audit --no-fund --loglevel=error
	touch $@

$(VENV)/.installed: rabbitmq/examples/python/requirements.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r rabbitmq/examples/python/requirements.txt
	touch $@

# Options go in BENCH_ARGS, for example BENCH_ARGS="--db sqlite --burst 5000";
# another broker is --amqp URL with --management URL (see the header for 4.3).
BENCH_ARGS ?=

# Minutes of faults (connections killed, broker stopped, database refused, SIGKILL)
# and a ledger check; writes docs/RELIABILITY.md. Stops the broker application:
# never run it beside make test.
chaos: services
	$(CARGO) test $(RELEASE) --test chaos -- --ignored --nocapture

# The tracing comparison's baseline: the release TRACING_BASELINE, which has
# no tracing code, built as `make test-upgrade` builds one (empty: none).
TRACING_BASELINE ?= v0.1.0
bench:
	$(if $(TRACING_BASELINE),bash scripts/previous-release.sh $(TRACING_BASELINE))
	$(CARGO) build --release --workspace && ./target/release/order-timeout-bench \
		$(if $(TRACING_BASELINE),--tracing-baseline target/upgrade/order-timeout-$(subst /,_,$(TRACING_BASELINE))) $(BENCH_ARGS)

bench-million:
	$(CARGO) build --release --workspace && ./target/release/order-timeout-bench --million $(BENCH_ARGS)

# What PostgreSQL alone allows for checkout's one statement (pgbench, no service).
bench-checkout-ceiling: databases
	$(CARGO) build $(RELEASE) && bash bench/checkout-ceiling.sh

clean:
	$(CARGO) clean
	rm -rf $(VENV)
