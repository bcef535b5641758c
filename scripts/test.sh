#!/usr/bin/env bash
# Set up a virtualenv, install the project with its test tools, run the whole suite:
# lint (ruff), types (mypy), the core tests, the real-engine integration tests, then the
# container tests (images built with podman, every overlay run as a pod).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'

# The core tests drive a headless Chromium (the drain timeline page, tests/timeline) and
# promtool (the alert rules, tests/observability), and the SGLang engine tests read each
# process's end with strace: Debian's packages chromium, prometheus and strace. The container
# tests (tests/pods, tests/init) build images and run containers and pods with podman on runc
# (catatonit for its pause image), from a base made by mmdebstrap with Debian's tini in it
# (the init comparison), and reach a pod's network with ip and nsenter. All installed here
# where missing (CI is a clean Debian, as root; apt-get update only when the install fails
# without it). Without root or apt-get those tests are skipped, as they say.
install_test_tools() {
    local missing=()
    [ -x /usr/bin/chromium ] || missing+=(chromium)
    command -v promtool >/dev/null 2>&1 || [ -x /usr/bin/promtool ] || missing+=(prometheus)
    command -v strace >/dev/null 2>&1 || missing+=(strace)
    # The init comparison (tests/init): Debian's tini beside `run`.
    command -v tini >/dev/null 2>&1 || missing+=(tini)
    command -v podman >/dev/null 2>&1 || missing+=(podman)
    command -v runc >/dev/null 2>&1 || missing+=(runc)
    command -v catatonit >/dev/null 2>&1 || [ -x /usr/libexec/podman/catatonit ] \
        || missing+=(catatonit)
    command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
    command -v ip >/dev/null 2>&1 || missing+=(iproute2)
    command -v nsenter >/dev/null 2>&1 || missing+=(util-linux)
    [ "${#missing[@]}" -eq 0 ] && return 0
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "not installed: ${missing[*]} (their tests are skipped; apt-get install ${missing[*]})"
        return 0
    fi
    echo "== apt-get install ${missing[*]}"
    local log=.engines/apt.log
    mkdir -p .engines
    local install=(timeout 900 apt-get install -y -qq --no-install-recommends "${missing[@]}")
    if ! DEBIAN_FRONTEND=noninteractive "${install[@]}" >"$log" 2>&1; then
        if ! { timeout 300 apt-get update -qq && \
               DEBIAN_FRONTEND=noninteractive "${install[@]}"; } >>"$log" 2>&1; then
            tail -n 30 "$log"
            echo "installing ${missing[*]} failed"
            exit 1
        fi
    fi
}
install_test_tools

echo "== ruff"
.venv/bin/ruff check .
echo "== mypy"
.venv/bin/mypy
echo "== core tests"
# Under coverage (COVERAGE=0: without), counting the Python processes the tests start that
# import a measured package (coordinator, worker_client, router_client, shutdown_wire,
# devstack): a .pth file in the virtualenv gives every Python process a finder that, while
# COORDINATOR_TEST_COVERAGE names the configuration, calls coverage.process_startup() when the
# first of those packages is imported. A process that never imports one (a test tree, a shell
# helper) does not load coverage at all, which keeps the run close to its time without
# coverage; one that does is measured from before its first line of measured code. Each
# measured process writes a file under .coverage-data/; they are combined and reported after
# the run, also when a test failed, and the script then exits with pytest's code.
# Configuration: pyproject.toml, [tool.coverage.*].
install_coverage_hook() {
    local site
    site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    .venv/bin/python - "$site/shutdown_coordinator_coverage.pth" <<'EOF'
import sys

HOOK = """
import os, sys

MEASURED = ("coordinator", "worker_client", "router_client", "shutdown_wire", "devstack")

class StartCoverageOnFirstImport:
    started = False

    def find_spec(self, name, path=None, target=None):
        if self.started or name.partition(".")[0] not in MEASURED:
            return None
        self.started = True
        try:
            sys.meta_path.remove(self)
            os.environ["COVERAGE_PROCESS_START"] = os.environ["COORDINATOR_TEST_COVERAGE"]
            import coverage
            coverage.process_startup()
        except Exception as exc:  # never in the way of the import itself
            sys.stderr.write(f"coverage did not start: {exc!r}\\n")
        finally:
            # Not inherited: coverage's own .pth would start it in every child at once.
            os.environ.pop("COVERAGE_PROCESS_START", None)
        return None

sys.meta_path.insert(0, StartCoverageOnFirstImport())
"""
with open(sys.argv[1], "w") as pth:
    # A namespace of its own: site runs each line inside a function.
    pth.write("import os; exec(%r, {}) if os.environ.get('COORDINATOR_TEST_COVERAGE') "
              "else None\n" % HOOK)
EOF
}
coverage_report() {
    .venv/bin/coverage combine -q || return
    # What combine could not read is the file of a process killed while it wrote it.
    local torn
    torn=$(find .coverage-data -maxdepth 1 -name '.coverage.*' | wc -l)
    if [ "$torn" -gt 0 ]; then
        echo "coverage: dropped $torn unreadable data file(s) (processes killed while saving)"
        find .coverage-data -maxdepth 1 -name '.coverage.*' -delete
    fi
    echo "== coverage (statements and branches, of the tests and of each process they started"
    echo "   that imported a measured package; fully covered files left out)"
    .venv/bin/coverage report --skip-covered --sort=cover || return
    .venv/bin/coverage json -q -o .coverage-data/coverage.json || return
    echo "-- totals (branches taken of all branches; coverage.py's statements+branches figure)"
    .venv/bin/python - .coverage-data/coverage.json <<'EOF'
import json
import sys

files = json.load(open(sys.argv[1]))["files"]
state_file = ("coordinator/drain/state_file.py", "coordinator/drain/state_schema.py",
              "coordinator/service/restore.py", "coordinator/service/persistence.py")
areas = {
    "coordinator": lambda name: name.startswith("coordinator/"),
    "coordinator/kill": lambda name: name.startswith("coordinator/kill/"),
    "coordinator/drain": lambda name: name.startswith("coordinator/drain/"),
    "state file modules": lambda name: name in state_file,
}
for area, member in areas.items():
    sums = [f["summary"] for name, f in files.items() if member(name)]
    taken = sum(s["covered_branches"] for s in sums)
    branches = sum(s["num_branches"] for s in sums)
    done = taken + sum(s["covered_lines"] for s in sums)
    total = branches + sum(s["num_statements"] for s in sums)
    print(f"{area:20} branches {taken:5}/{branches:<5} {100 * taken / max(branches, 1):5.1f}%"
          f"   statements+branches {100 * done / max(total, 1):5.1f}%")
EOF
    echo "(each line and branch: .venv/bin/coverage report -m --include=PATTERN;"
    echo " data in .coverage-data/.coverage, JSON in .coverage-data/coverage.json)"
}
# The engines install (mostly downloads and unpacking) while the core tests run, and after
# them the container tests' Debian bases are made (mmdebstrap: downloads and dpkg; kept in
# .pods/ and made again only when their package lists change); the engine and container
# tests wait for both below.
mkdir -p .engines
{ bash scripts/engines.sh && .venv/bin/python -m tests.pods.images --bases; } \
    > .engines/install.log 2>&1 &
engines_install=$!
# The core tests run in CORE_WORKERS pytest-xdist workers (2 by default; 0: in this process):
# most of their time is waiting on the processes they start, and each test's janitor owns
# only what its own worker started, so two tests at a time fill a 2-core machine that one
# leaves half idle. worksteal rebalances the long tests (the group drain's) as workers empty.
workers=(-n "${CORE_WORKERS:-2}" --dist worksteal --durations=15)
started=$SECONDS
status=0
if [ "${COVERAGE:-1}" = 0 ]; then
    .venv/bin/pytest "${workers[@]}" || status=$?
else
    rm -rf .coverage-data .coverage
    install_coverage_hook
    COORDINATOR_TEST_COVERAGE="$PWD/pyproject.toml" \
        COVERAGE_FILE="$PWD/.coverage-data/.coverage" .venv/bin/pytest "${workers[@]}" \
        || status=$?
fi
echo "core tests: $((SECONDS - started)) s wall time (coverage: ${COVERAGE:-1})"
if [ "${COVERAGE:-1}" != 0 ]; then
    coverage_report || echo "coverage: no report (see the errors above)"
fi
if [ "$status" != 0 ]; then
    kill "$engines_install" 2>/dev/null || true
    wait "$engines_install" 2>/dev/null || true
    exit "$status"
fi
echo "== chaos soak (short)"
# 50 drains of every kind (graceful, abort, force, crash, coordinator and router restarts,
# stubborn and daemonizing children, joined calls, hostile requests) under streaming load,
# each checked against ground truth; non-zero when any was not (bench/soak.py).
.venv/bin/python -m bench.soak --drains 50 --max-seconds 170 --quiet
echo "== real-engine integration tests (vLLM and SGLang on the CPU, Dynamo frontend + workers,"
echo "   smg and vllm-router in front of simulated engines, a rolling update behind smg)"
if ! wait "$engines_install"; then
    cat .engines/install.log
    echo "installing the engines failed"
    exit 1
fi
cat .engines/install.log
engine_started=$SECONDS
# Two streams side by side, each one real engine's CPU at a time at most:
# - the real engines (vLLM, SGLang with one and two schedulers, Dynamo, stock SGLang and
#   vLLM migrated through the proxy), in the foreground;
# - the real routers in front of simulated engines (light: mostly waiting), the real engines
#   under `run` (tests/init), then the container tests (podman: the images built from
#   deploy/container/Dockerfile, overlays as pods with their engines deleted with a stream
#   in flight as the kubelet deletes them, the engine as PID 1 under run, tini, tini -g,
#   dumb-init, no init), logged to .engines/second-stream.log.
# Each stream's output is shown whole once both have ended, then the tests that need the
# machine to themselves run (alone_engines); the step fails if any part did.
# In CI's time budget (CONTAINER_TESTS unset, or ci): the images built and run as the
# manifests run them, health check included; the vllm and sglang overlays as shipped, each a
# pod with its real engine deleted with a stream in flight (minutes each: the engines start
# slowly on 2 cores); the init comparison. CONTAINER_TESTS=all also runs the pod runner's
# own tests, the adopted-vllm, vllm-init, dynamo-worker and trtllm overlays and every
# baseline, which make docs/deploy.md's table; any other value is a pytest -k expression
# over all of them.
container_paths=(tests/pods tests/init)
selection=${CONTAINER_TESTS:-ci}
alone_selection=$selection
case "$selection" in
    ci)
        container_paths=(tests/pods/test_image.py tests/pods/test_overlays.py tests/init)
        selection="not overlay or sidecar and (sglang or vllm and not adopted)"
        alone_selection=vllm ;;
    all) selection=""; alone_selection="" ;;
esac
# Real-engine tests that run alone once both streams have ended, not in the foreground's
# tests/engines: the vLLM continuation (a drainable and a stock vLLM behind each router)
# holds every process of the drained tree to exit 0 with no SIGKILL, and vLLM pins every
# Worker of every vLLM on the machine to the first core, where a Worker's own teardown took
# over the 60 s EngineCore waits for it beside the foreground's engines (EngineCore then
# SIGKILLed it); alone it took 3 min here.
# The stock-ending test too: beside the second stream its vLLM case's drain started 12 s
# after the stream, which had ended by then (twice); alone it passed.
# The real engines under `run` too: beside the foreground's engines, vLLM's Worker once did
# not leave within the 20 s EngineCore gives it, and EngineCore SIGKILLed it.
alone_engines=(tests/engines/test_vllm_continuation.py tests/engines/test_stock_ending.py
    tests/init/test_real_engines.py)
# Likewise the migrating overlays as pods (two real engine pods, the proxy's pod,
# vllm-router; one engine pod deleted under streaming load: its streams continue on the
# other): vLLM's in CI's selection, SGLang's too with CONTAINER_TESTS=all.
alone_containers=(tests/pods/test_migration.py)
# Each step runs whatever the one before it did: the container step builds the images the
# pod tests run alone later need, so a failure before it must not skip it.
second_stream() {
    local started=$SECONDS status=0
    echo "== real routers in front of simulated engines, init under run"
    .venv/bin/pytest -m engine -p no:cacheprovider tests/routers tests/bench/test_rollout.py \
        tests/init --ignore=tests/init/test_real_engines.py || status=$?
    echo "routers and run: $((SECONDS - started)) s wall time"
    started=$SECONDS
    echo "== container tests (podman)"
    .venv/bin/pytest -m container -p no:cacheprovider "${container_paths[@]}" -k "$selection" \
        "${alone_containers[@]/#/--ignore=}" || status=$?
    echo "container tests: $((SECONDS - started)) s wall time"
    return "$status"
}
second_log=.engines/second-stream.log
second_stream > "$second_log" 2>&1 &
second=$!
engine_status=0
.venv/bin/pytest -m engine tests/engines "${alone_engines[@]/#/--ignore=}" \
    || engine_status=$?
echo "real engines: $((SECONDS - engine_started)) s wall time"
second_status=0
wait "$second" || second_status=$?
echo "== the second stream (run beside the real engines)"
cat "$second_log"
echo "== real engines that need the machine to themselves"
alone_status=0
.venv/bin/pytest -m engine -p no:cacheprovider "${alone_engines[@]}" || alone_status=$?
# (5: a -k selection that leaves none of them.)
.venv/bin/pytest -m container -p no:cacheprovider "${alone_containers[@]}" \
    -k "$alone_selection" || { code=$?; [ "$code" = 5 ] || alone_status=$code; }
echo "engine and container tests: $((SECONDS - engine_started)) s wall time"
if [ "$alone_status" != 0 ]; then
    exit "$alone_status"
fi
if [ "$engine_status" != 0 ]; then
    exit "$engine_status"
fi
if [ "$second_status" != 0 ]; then
    exit "$second_status"
fi
