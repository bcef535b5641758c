#!/bin/sh
# Put the shutdown-coordinator's engine side into an engine image (deploy/container/Dockerfile,
# target `engine`; docs/image.md):
#
# 1. find the engine's Python (ENGINE_PYTHON, default: python3 on PATH, the one the engine's
#    entrypoint runs);
# 2. check that the preStop hook (standard library only) compiles with it;
# 3. unless WORKER_CLIENT=0 (an adopted engine needs the hook only): check it is 3.11 or
#    later, find a pip for it (its own `python3 -m pip`; else uv, for images whose Python is
#    a uv-made venv without pip; else pip bootstrapped by ensurepip);
# 4. install the worker_client wheel from WHEEL_DIR by its file (never looked up by name on
#    an index), without dependencies;
# 5. install its requirements (WHEEL_DIR/requirements.txt): nothing changes when the engine
#    already has them at a version that fits, else the index is asked;
# 6. import worker_client with the engine's Python.
#
#   install_into_engine.sh WHEEL_DIR
#
# WHEEL_DIR holds what worker_client_wheel.py wrote. HOOK is the hook's path (default
# /opt/shutdown-coordinator/hook/drain_hook.py, where the manifests run it). POSIX sh only.
set -eu

wheels=${1:?usage: install_into_engine.sh WHEEL_DIR}
py=${ENGINE_PYTHON:-python3}
hook=${HOOK:-/opt/shutdown-coordinator/hook/drain_hook.py}
worker_client=${WORKER_CLIENT:-1}

fail() {
    echo "install_into_engine: $*" >&2
    exit 1
}

# 1. The engine's Python.
command -v "$py" >/dev/null 2>&1 ||
    fail "no '$py' in this image; set ENGINE_PYTHON (--build-arg ENGINE_PYTHON=...) to the engine's interpreter"
echo "install_into_engine: engine Python: $(command -v "$py") ($("$py" -V 2>&1))"

# 2. The preStop hook compiles with it (in memory: no __pycache__ is written).
[ -f "$hook" ] || fail "no preStop hook at $hook"
"$py" -c 'import sys; compile(open(sys.argv[1], encoding="utf-8").read(), sys.argv[1], "exec")' "$hook" ||
    fail "the preStop hook $hook does not compile with $py"

case "$worker_client" in
    0) echo "install_into_engine: WORKER_CLIENT=0: the preStop hook only"; exit 0 ;;
    1) ;;
    *) fail "WORKER_CLIENT must be 0 or 1, not '$worker_client'" ;;
esac

# 3. Python 3.11 or later, and a pip for it. The engine's Python is an image's own, not the
# distribution's: installing into it is what building this image is for.
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    fail "worker_client needs Python 3.11 or later; $py is $("$py" -V 2>&1). Build with --build-arg WORKER_CLIENT=0 for the preStop hook alone"
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore \
    PIP_BREAK_SYSTEM_PACKAGES=1 UV_NO_CACHE=1 UV_BREAK_SYSTEM_PACKAGES=1
if "$py" -m pip --version >/dev/null 2>&1; then
    installer=pip
elif command -v uv >/dev/null 2>&1; then
    installer=uv
elif "$py" -m ensurepip --default-pip >/dev/null 2>&1 && "$py" -m pip --version >/dev/null 2>&1; then
    installer=pip
else
    fail "$py has no pip, no uv is on PATH, and ensurepip could not install pip"
fi
echo "install_into_engine: installing with $installer"
pip_install() {
    if [ "$installer" = uv ]; then
        uv pip install --python "$(command -v "$py")" "$@"
    else
        "$py" -m pip install "$@"
    fi
}

# 4. The wheel, by its file.
wheel=
for candidate in "$wheels"/shutdown_coordinator_worker_client-*-py3-none-any.whl; do
    [ -f "$candidate" ] || continue
    [ -z "$wheel" ] || fail "more than one worker_client wheel in $wheels"
    wheel=$candidate
done
[ -n "$wheel" ] || fail "no worker_client wheel in $wheels"
pip_install --no-deps --no-index "$wheel"

# 5. Its requirements, resolved against what the engine has.
[ -f "$wheels/requirements.txt" ] || fail "no requirements.txt in $wheels"
pip_install -r "$wheels/requirements.txt"

# 6. It imports.
"$py" -c 'import worker_client; print("install_into_engine: worker_client from", worker_client.__file__)'
