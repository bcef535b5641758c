"""The images the pod tests run, built here with podman from a Debian base made here.

No registry is reachable, so nothing is pulled:

1. Two bases, each a Debian bookworm ``mmdebstrap --variant=minbase`` tree (from the mirror
   the host's apt uses) imported with ``podman import``: ``BASE`` (python3 and pip: what the
   recipe's stages need of an official Python image; and Debian's tini, for the init
   comparison's containers, ``tests/init/containers.py``) and ``ENGINE_BASE`` (also libnuma1 and
   g++, which vLLM's CPU build needs at run time: its kernels link libnuma, and
   ``torch.compile`` builds C++ with g++; vLLM's own CPU image installs both; and tini, for
   the real engines' init comparison). The package
   list is a label of the image: a base is made again only when its list changes.
2. A wheelhouse: the sidecar's dependencies and the build backend, downloaded on this machine
   by the tests' own pip (``pip download``), once per set of requirements in
   ``pyproject.toml``. The builds run with ``--network none`` and take them from it (the
   recipe's ``PIP_NO_INDEX``/``PIP_FIND_LINKS`` arguments): the host reaches PyPI through a
   proxy whose certificate a container does not trust.
3. The sidecar: ``deploy/container/Dockerfile`` as it is, default target, ``BASE_IMAGE`` and
   ``BUILDER_IMAGE`` set to ``BASE``, tagged with the name the manifests give it (``SIDECAR``),
   as a node that pulled it would have it.
4. The engines' images, from the same recipe's ``engine`` target on ``ENGINE_BASE`` (the
   preStop hook at the manifests' path, ``worker_client`` installed into the image's python3),
   then one thin layer per engine (``Containerfile.engine``): its virtualenv's ``bin`` first
   on ``PATH``. The virtualenvs themselves (``ENGINES_DIR``, 3-7 GB each) are not copied in:
   the pod mounts each read-only from the host at its own path, with the CPython it was made
   from (its ``bin/python`` is a link to it). Copying them would write several GB into the
   image store on every change of the engine and cost minutes of CI for bytes a read-only
   mount gives at once; what differs from an engine's published image is only where the
   same files come from.
5. An engine's image with the coordinator as its init (the ``vllm-init`` overlay's):
   ``deploy/container/Dockerfile.engine-init`` as it is, on that engine's image of step 4
   (whose python3 at build time is the base's: the engine's virtualenv is only mounted in
   the pod), as the engine's user.
6. The simulated engine's image (for the engines that cannot run here): the sidecar image
   (the project and its dependencies, devstack's simulated engine among them) with the
   recipe's ``engine`` target on top (the hook; ``worker_client`` is already there), and
   ``PATH``/``PYTHONPATH`` set for the engine shims the pod mounts.
7. The recipe's ``drainable`` target on ``ENGINE_BASE``, per engine that has a drainable
   server (``DRAINABLE``: vllm, sglang): the engine target plus that server, where the
   migrating overlays' engine command runs it; with the thin layer of step 4 on top, the
   migrating overlays' engine image (``drainable_engine``).

The recipe's builds run without podman's layer cache (``--layers=false``): podman 4.3's
builder (buildah 1.28) mounts nothing for ``RUN --mount=type=bind,from=<stage>`` when that
stage came from the cache (containers/podman#16281), and does not make such a ``RUN`` miss
the cache when the stage's files changed (containers/buildah#6609), which would install
yesterday's wheels without a word. The bases, the wheelhouse and the thin test layers are
cached.
``python -m tests.pods.images`` builds everything and prints how long each step took.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.pods.podman import PODS_DIR, REPO, Podman, unavailable

SUITE = "bookworm"
BASE = f"localhost/debian-python:{SUITE}"
BASE_PACKAGES = ("python3", "python3-pip", "tini")
"""tini: the init comparison (tests/init) runs its containers on this base too."""
ENGINE_BASE = f"localhost/debian-python-engine:{SUITE}"
ENGINE_BASE_PACKAGES = ("python3", "python3-pip", "libnuma1", "g++", "tini")
"""tini: the real engines under each init (``tests/init/real_containers.py``) run on it."""
BASE_LABEL = "io.shutdown-coordinator.test.packages"
SIDECAR = "ghcr.io/shutdown-coordinator/shutdown-coordinator:0.1.0"
"""The coordinator's image, by the name the manifests give it (deploy/kubernetes/base)."""
ENGINE_HOOK = "localhost/engine-hook:test"
"""The recipe's engine target on ``ENGINE_BASE``: what each engine's layer starts from."""
SIM_ENGINE = "localhost/simulated-engine:test"
RECIPE = REPO / "deploy" / "container" / "Dockerfile"
INIT_RECIPE = REPO / "deploy" / "container" / "Dockerfile.engine-init"
IGNORE_FILE = REPO / "deploy" / "container" / "Dockerfile.dockerignore"
ENGINE_LAYER = Path(__file__).with_name("Containerfile.engine")
SIM_LAYER = Path(__file__).with_name("Containerfile.sim")
WHEELHOUSE_IN_BUILD = "/wheelhouse"
MMDEBSTRAP_TIMEOUT_S = 900.0
BUILD_TIMEOUT_S = 900.0


def engine_image(engine: str) -> str:
    return f"localhost/{engine}-engine:test"


def engine_init_image(engine: str) -> str:
    return f"localhost/{engine}-engine-init:test"


@dataclass
class Timings:
    """How long each step took (seconds of wall time), in the order they ran."""

    steps: list[tuple[str, float]] = field(default_factory=list)

    @contextmanager
    def step(self, what: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.steps.append((what, time.monotonic() - started))

    def lines(self) -> list[str]:
        return [f"{seconds:7.1f} s  {what}" for what, seconds in self.steps]


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


class Images:
    """Builds (or finds, when nothing changed) every image the pod tests run."""

    def __init__(self, podman: Podman, home: Path = PODS_DIR) -> None:
        self.podman = podman
        self.home = home
        self.timings = Timings()
        self._built: set[str] = set()
        """The images this instance built (or found): each is built once per session."""

    # 1. The bases.

    def base(self, image: str = BASE, packages: tuple[str, ...] = BASE_PACKAGES) -> str:
        """A Debian minbase with ``packages``, imported as ``image``; made again only when
        the package list (its label) differs."""
        stamp = _digest(SUITE, *packages)
        if self.podman.image_exists(image) and \
                self.podman.image_labels(image).get(BASE_LABEL) == stamp:
            return image
        tarball = self.home / "cache" / f"{image.rsplit('/', 1)[1].replace(':', '-')}.tar"
        tarball.parent.mkdir(parents=True, exist_ok=True)
        with self.timings.step(f"mmdebstrap {SUITE} minbase + {' '.join(packages)}"):
            subprocess.run(["mmdebstrap", "--variant=minbase", "--quiet",
                            f"--include={','.join(packages)}", SUITE, str(tarball)],
                           check=True, timeout=MMDEBSTRAP_TIMEOUT_S,
                           stdin=subprocess.DEVNULL)
        with self.timings.step(f"podman import {image}"):
            self.podman.run("import", "--change", 'CMD ["python3"]',
                            "--change", f"LABEL {BASE_LABEL}={stamp}",
                            str(tarball), image, timeout=BUILD_TIMEOUT_S)
        tarball.unlink()
        return image

    # 2. The wheelhouse.

    def wheelhouse(self) -> Path:
        """The sidecar's requirements and build backend as wheels, downloaded once per set
        of requirements."""
        project = tomllib.loads((REPO / "pyproject.toml").read_text())
        wanted = [*project["build-system"]["requires"], *project["project"]["dependencies"]]
        directory = self.home / "cache" / f"wheelhouse-{_digest(*wanted)}"
        if (directory / ".complete").exists():
            return directory
        directory.mkdir(parents=True, exist_ok=True)
        with self.timings.step("pip download (the wheelhouse)"):
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet",
                            "--only-binary=:all:", "--dest", str(directory), *wanted],
                           check=True, timeout=BUILD_TIMEOUT_S, stdin=subprocess.DEVNULL)
        (directory / ".complete").write_text("\n".join(wanted) + "\n")
        return directory

    def build(self, what: str, *args: str, context: Path = REPO, cache: bool = False) -> None:
        """``podman build`` offline, with the wheelhouse mounted and pip pointed at it; no
        layer cache unless ``cache`` (see the module's docstring)."""
        wheels = self.wheelhouse()
        with self.timings.step(f"podman build {what}"):
            self.podman.run(
                "build", "--format", "docker", "--network", "none", "--pull=never",
                f"--layers={'true' if cache else 'false'}",
                "--volume", f"{wheels}:{WHEELHOUSE_IN_BUILD}:ro",
                "--build-arg", "PIP_NO_INDEX=1",
                "--build-arg", f"PIP_FIND_LINKS={WHEELHOUSE_IN_BUILD}",
                *args, str(context), timeout=BUILD_TIMEOUT_S)

    # 3. The sidecar.

    def sidecar(self) -> str:
        if SIDECAR in self._built:
            return SIDECAR
        base = self.base()
        self.build("the sidecar (deploy/container/Dockerfile)",
                   "--file", str(RECIPE), "--ignorefile", str(IGNORE_FILE),
                   "--build-arg", f"BASE_IMAGE={base}", "--build-arg", f"BUILDER_IMAGE={base}",
                   "--tag", SIDECAR)
        self._built.add(SIDECAR)
        return SIDECAR

    # 4. The engines.

    def engine_hook(self) -> str:
        if ENGINE_HOOK in self._built:
            return ENGINE_HOOK
        base = self.base(ENGINE_BASE, ENGINE_BASE_PACKAGES)
        self.build("the engine target (deploy/container/Dockerfile --target engine)",
                   "--file", str(RECIPE), "--ignorefile", str(IGNORE_FILE),
                   "--target", "engine", "--build-arg", f"BASE_IMAGE={base}",
                   "--build-arg", f"BUILDER_IMAGE={self.base()}", "--tag", ENGINE_HOOK)
        self._built.add(ENGINE_HOOK)
        return ENGINE_HOOK

    def engine(self, name: str, venv: Path) -> str:
        """``name``'s image: the hook image with ``venv`` first on ``PATH`` (the pod mounts
        ``venv`` and ``python_home(venv)`` read-only at their own paths)."""
        self.engine_hook()
        self.build(f"the {name} engine layer (tests/pods/Containerfile.engine)",
                   "--file", str(ENGINE_LAYER), "--build-arg", f"BASE={ENGINE_HOOK}",
                   "--build-arg", f"VENV={venv}",
                   "--build-arg", f"PYTHON_HOME={python_home(venv)}",
                   "--tag", engine_image(name), context=ENGINE_LAYER.parent, cache=True)
        return engine_image(name)

    # 5. An engine behind the coordinator.

    def engine_init(self, name: str, venv: Path) -> str:
        """``name``'s image (``engine``) with the coordinator as its init."""
        base = self.engine(name, venv)
        self.build(f"the {name} engine with the coordinator as its init "
                   "(deploy/container/Dockerfile.engine-init)",
                   "--file", str(INIT_RECIPE), "--ignorefile", str(IGNORE_FILE),
                   "--build-arg", f"ENGINE_IMAGE={base}", "--build-arg", "ENGINE_USER=1000:1000",
                   "--tag", engine_init_image(name))
        return engine_init_image(name)

    # 7. An engine's drainable target.

    def drainable(self, engine: str) -> str:
        """The recipe's ``drainable`` target for ``engine`` on the engine base."""
        image = f"localhost/{engine}-drainable-hook:test"
        if image in self._built:
            return image
        base = self.base(ENGINE_BASE, ENGINE_BASE_PACKAGES)
        self.build(f"the {engine} drainable target (deploy/container/Dockerfile --target "
                   "drainable)", "--file", str(RECIPE), "--ignorefile", str(IGNORE_FILE),
                   "--target", "drainable", "--build-arg", f"DRAINABLE={engine}",
                   "--build-arg", f"BASE_IMAGE={base}",
                   "--build-arg", f"BUILDER_IMAGE={self.base()}", "--tag", image)
        self._built.add(image)
        return image

    def drainable_engine(self, name: str, venv: Path) -> str:
        """``name``'s drainable image (``drainable``) with ``venv`` first on ``PATH``, as
        ``engine`` makes the engine target's: the migrating overlays' engine."""
        image = f"localhost/{name}-drainable:test"
        self.build(f"the {name} drainable engine layer (tests/pods/Containerfile.engine)",
                   "--file", str(ENGINE_LAYER), "--build-arg", f"BASE={self.drainable(name)}",
                   "--build-arg", f"VENV={venv}",
                   "--build-arg", f"PYTHON_HOME={python_home(venv)}",
                   "--tag", image, context=ENGINE_LAYER.parent, cache=True)
        return image

    # 6. The simulated engine.

    def simulated_engine(self) -> str:
        if SIM_ENGINE in self._built:
            return SIM_ENGINE
        sidecar = self.sidecar()
        hook_only = "localhost/simulated-engine-hook:test"
        self.build("the simulated engine (--target engine on the sidecar image)",
                   "--file", str(RECIPE), "--ignorefile", str(IGNORE_FILE),
                   "--target", "engine", "--build-arg", f"BASE_IMAGE={sidecar}",
                   "--build-arg", f"BUILDER_IMAGE={self.base()}",
                   "--build-arg", "WORKER_CLIENT=0", "--tag", hook_only)
        self.build("the simulated engine layer (tests/pods/Containerfile.sim)",
                   "--file", str(SIM_LAYER), "--build-arg", f"BASE={hook_only}",
                   "--tag", SIM_ENGINE, context=SIM_LAYER.parent, cache=True)
        self._built.add(SIM_ENGINE)
        return SIM_ENGINE


def python_home(venv: Path) -> Path:
    """The prefix of the CPython ``venv`` was made from (its ``home``, one level up), which
    the pod mounts beside it: the venv's ``bin/python`` is a link into it."""
    for line in (venv / "pyvenv.cfg").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home":
            return Path(value.strip()).resolve().parent
    raise ValueError(f"{venv}/pyvenv.cfg names no home")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines-dir", type=Path, default=None,
                        help="build the engine images for the virtualenvs found here too")
    parser.add_argument("--bases", action="store_true",
                        help="only the two Debian bases and the wheelhouse (what is slow to "
                             "make and rarely changes), when podman can run here")
    args = parser.parse_args()
    reason = unavailable()
    if reason is not None:
        print(f"no images: {reason}")
        return 0 if args.bases else 1
    podman = Podman()
    podman.prepare()
    images = Images(podman)
    if args.bases:
        images.base()
        images.base(ENGINE_BASE, ENGINE_BASE_PACKAGES)
        images.wheelhouse()
        print("\n".join(images.timings.lines()) or "the bases were already made")
        return 0
    built = [images.sidecar(), images.simulated_engine()]
    if args.engines_dir is not None:
        for venv in sorted(p for p in args.engines_dir.iterdir() if (p / ".installed").exists()):
            if venv.name != "routers":
                built.append(images.engine(venv.name, venv))
    print("\n".join(images.timings.lines()))
    for image in built:
        size = podman.run("image", "inspect", "--format", "{{.Size}}", image).stdout.strip()
        print(f"{image}: {int(size) / 1e6:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
