"""The coordinator's container recipe (deploy/container/), checked without a container
engine: what each image runs, as whom, on which base, its health check and the engine side's
installer, which run for real (docs/image.md says what this does not cover)."""

from __future__ import annotations

import ast
import fnmatch
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from coordinator import settings
from tests.deploy import dockerfile, rendering
from tests.deploy.rendering import DRAIN_HOOK, KUBERNETES_DIR, REPO, kubectl
from tests.service.servers import start_coordinator
from tests.support.processes import ProcessJanitor

CONTAINER = REPO / "deploy" / "container"
DOCKERFILE = CONTAINER / "Dockerfile"
HEALTHCHECK = CONTAINER / "healthcheck.py"
WHEEL_BUILDER = CONTAINER / "worker_client_wheel.py"
INSTALLER = CONTAINER / "install_into_engine.sh"
IMAGE_DOC = REPO / "docs" / "image.md"
SMALL_BASES = ("-slim", "-alpine", "distroless")


@pytest.fixture(scope="module")
def final() -> dockerfile.Stage:
    stages = dockerfile.parse(DOCKERFILE)
    assert len(stages) >= 2, "build in a separate stage so the image carries no build tools"
    return stages[-1]


def test_image_is_small_and_runs_as_a_numeric_non_root_user(final: dockerfile.Stage) -> None:
    """1. The final stage starts from a slim base.
    2. Its last USER is numeric (so the kubelet can check runAsNonRoot) and not 0.
    """
    assert any(marker in final.base for marker in SMALL_BASES), final.base
    user = final.last("USER")
    assert user is not None, "no USER: the image would run as root"
    uid, _, gid = user.arguments.partition(":")
    assert uid.isdigit(), f"USER {user.arguments} is not numeric"
    assert int(uid) != 0
    assert not gid or (gid.isdigit() and int(gid) != 0)


def test_entrypoint_is_the_console_script(final: dockerfile.Stage) -> None:
    """1. ENTRYPOINT is the project's console script and CMD is `serve` (exec forms, so
       SIGTERM reaches the coordinator, not a shell).
    2. The console script is the one pyproject.toml declares.
    """
    entrypoint = final.last("ENTRYPOINT")
    cmd = final.last("CMD")
    assert entrypoint is not None
    assert cmd is not None
    assert entrypoint.exec_form() == ["shutdown-coordinator"]
    assert cmd.exec_form() == ["serve"]
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert "shutdown-coordinator" in scripts


def test_healthcheck_runs_a_script_the_image_contains(final: dockerfile.Stage) -> None:
    """1. HEALTHCHECK uses the exec form and bounds each probe with a timeout.
    2. The script it runs is copied into the final stage from deploy/container/.
    """
    check = final.last("HEALTHCHECK")
    assert check is not None, "no HEALTHCHECK"
    assert "--timeout=" in check.arguments
    command = check.arguments[check.arguments.index("CMD") + 3 :].strip()
    argv = dockerfile.Instruction("CMD", command, check.line).exec_form()
    assert argv is not None
    assert argv[0].startswith("python")
    copies = {c.words()[-1]: c.words()[-2] for c in final.all("COPY")}
    assert argv[1] in copies, f"{argv[1]} is not copied into the image"
    assert (REPO / copies[argv[1]]).resolve() == HEALTHCHECK


DRAINABLE_ENGINES = ("vllm", "sglang")
"""The values of the recipe's ``DRAINABLE`` argument: the engines a migrating overlay runs."""


def test_every_copied_path_exists_and_is_in_the_build_context() -> None:
    """1. Every COPY source (not from another stage) exists in the repository.
    2. The Dockerfile's own .dockerignore lets it into the build context.
    3. The same holds for every file a RUN bind-mounts from the context.
    """
    ignore = [
        line.strip()
        for line in (CONTAINER / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for stage in dockerfile.parse(DOCKERFILE):
        for copy in stage.all("COPY"):
            words = copy.words()
            if any(w.startswith("--from") for w in words):
                continue
            sources = [w for w in words[:-1] if not w.startswith("--")]
            # The drainable target copies one engine's server, named by a build argument:
            # every engine a migrating overlay runs.
            sources = [s.replace("${DRAINABLE}", engine) for s in sources
                       for engine in (DRAINABLE_ENGINES if "${DRAINABLE}" in s else ("",))]
            for source in sources:
                assert (REPO / source).exists(), f"line {copy.line}: {source} does not exist"
                assert _included(source.rstrip("/"), ignore), f"{source} is ignored"
        # 3. So does every file a RUN bind-mounts from the build context.
        for run in stage.all("RUN"):
            for mount in run.mounts():
                if mount.get("type") != "bind" or "from" in mount:
                    continue
                source = mount["source"]
                assert (REPO / source).exists(), f"line {run.line}: {source} does not exist"
                assert _included(source, ignore), f"{source} is ignored"


def test_the_sidecars_build_stage_copies_every_package_the_distribution_ships() -> None:
    """The stage that builds the sidecar's wheels copies each package ``pyproject.toml``'s
    ``packages.find`` includes (a package left out builds a wheel without it: the
    coordinator would fail to import at start), and the engine's wheel stage copies what
    its builder packs."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    shipped = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]
               ["include"]}
    stages = {s.name: s for s in dockerfile.parse(DOCKERFILE)}

    def copied(stage: dockerfile.Stage) -> set[str]:
        return {w.rstrip("/") for c in stage.all("COPY") for w in c.words()[:-1]
                if not w.startswith("--")}

    builder = next(s for s in stages.values() if "pyproject.toml" in copied(s)
                   and "coordinator" in copied(s))
    assert shipped <= copied(builder), shipped - copied(builder)
    tree = ast.parse((CONTAINER / "worker_client_wheel.py").read_text())
    packed = next(ast.literal_eval(node.value) for node in tree.body
                  if isinstance(node, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == "PACKAGES" for t in node.targets))
    assert set(packed) <= copied(stages["worker-wheel"])


def _included(path: str, patterns: list[str]) -> bool:
    included = True
    for pattern in patterns:
        negated = pattern.startswith("!")
        glob = pattern.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, glob) or path.startswith(glob + "/"):
            included = negated
    return included


def test_default_port_matches_the_coordinator_and_the_manifests(final: dockerfile.Stage) -> None:
    """1. The image exposes the port it configures in SHUTDOWN_COORDINATOR_PORT.
    2. That is the coordinator's default and the port the Kubernetes base uses.
    """
    exposed = final.last("EXPOSE")
    assert exposed is not None
    env = " ".join(i.arguments for i in final.all("ENV"))
    assert f"SHUTDOWN_COORDINATOR_PORT={exposed.arguments}" in env
    assert int(exposed.arguments) == settings.DEFAULT_PORT
    base_env = (REPO / "deploy/kubernetes/base/coordinator.env").read_text()
    assert f"SHUTDOWN_COORDINATOR_PORT={exposed.arguments}" in base_env


def _healthcheck(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(HEALTHCHECK)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_healthcheck_passes_against_a_live_coordinator(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. Start the real coordinator on a free loopback port.
    2. Run the health check with the environment the image sets (wildcard host, the port).
    3. It exits 0.
    """
    running = start_coordinator(janitor, tmp_path)
    port = running.url.rsplit(":", 1)[1]
    done = _healthcheck({"SHUTDOWN_COORDINATOR_HOST": "0.0.0.0", "SHUTDOWN_COORDINATOR_PORT": port})
    assert done.returncode == 0, done.stdout + done.stderr


def test_healthcheck_fails_when_nothing_answers(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. Start a coordinator, note its port, stop it (SIGTERM) and wait for it to exit.
    2. The health check against that port exits 1 and says why.
    """
    running = start_coordinator(janitor, tmp_path)
    port = running.url.rsplit(":", 1)[1]
    running.proc.terminate()
    assert running.proc.wait(timeout=30) == 0
    done = _healthcheck(
        {"SHUTDOWN_COORDINATOR_HOST": "127.0.0.1", "SHUTDOWN_COORDINATOR_PORT": port}
    )
    assert done.returncode == 1
    assert "unhealthy" in done.stdout


# --- One recipe, two images: the sidecar and an engine's image ---------------------------


def _engine_bases() -> list[str]:
    """The engine images the shipped engine components run (deploy/kubernetes/engines/*)."""
    found = set()
    for path in sorted((KUBERNETES_DIR / "engines").glob("*/kustomization.yaml")):
        for image in yaml.safe_load(path.read_text()).get("images") or ():
            if image.get("name") == "inference-engine" and image.get("newName"):
                found.add(f"{image['newName']}:{image.get('newTag') or 'latest'}")
    return sorted(found)


ENGINE_BASES = _engine_bases()
DOCUMENTED_ENGINE_BASES = ("vllm/vllm-openai", "lmsysorg/sglang",
                           "nvcr.io/nvidia/ai-dynamo/vllm-runtime")
BUILD_MODES = [pytest.param("sidecar", {}, id="sidecar")] + [
    pytest.param("engine", {"BASE_IMAGE": base}, id=f"engine on {base}")
    for base in ENGINE_BASES
]
PROGRAMS = {"python": {"python3"}, "engine": {"sh", "python3"}}
"""What a RUN may invoke, by the kind of its stage's base: an official Python image has
python3 and its pip (``python3 -m pip``; a ``pip`` script on PATH is not promised); an
engine's image has a POSIX ``sh`` and python3 (whose pip the installer finds)."""


def _kind(base: str) -> str:
    return "python" if re.match(r"python:[^/]*$", base) else "engine"


def _engine_pod() -> dict[str, object]:
    deployment = yaml.safe_load(
        (KUBERNETES_DIR / "base" / "engine-deployment.yaml").read_text())
    pod: dict[str, object] = deployment["spec"]["template"]["spec"]
    return pod


def test_the_base_is_a_build_argument_and_the_default_build_is_the_slim_sidecar() -> None:
    """1. Every stage but the wheel builder and the drainable engine (the engine stage with
    the server added) starts from ``${BASE_IMAGE}``; its default is the slim Python of
    ``PYTHON_VERSION``.
    2. The last stage, which a build without ``--target`` makes, is the sidecar.
    3. The engine bases the recipe names are the ones the engine components run."""
    stages = dockerfile.parse(DOCKERFILE)
    version = stages[0].base.split(":", 1)[1].removesuffix("-slim")
    assert dockerfile.stage(stages, "drainable").base_text == "engine"
    for stage in stages:
        if stage.name not in ("worker-wheel", "drainable"):
            assert stage.base_text == "${BASE_IMAGE}", stage.name
            assert stage.base == f"python:{version}-slim"
    assert stages[-1].name == "sidecar"
    text = DOCKERFILE.read_text()
    for name in DOCUMENTED_ENGINE_BASES:
        assert name in text
        assert any(base.startswith(name + ":") for base in ENGINE_BASES), name


@pytest.mark.parametrize(("target", "build_args"), BUILD_MODES)
def test_each_build_mode_parses_and_each_stage_runs_only_what_its_base_has(
    target: str, build_args: dict[str, str]
) -> None:
    """1. The recipe parses with the mode's build arguments; the target starts from the base
    asked for (the slim Python by default).
    2. It is built from the stages it needs and no other: the sidecar from its wheels, an
    engine's image from the worker_client wheel (never the service's dependencies).
    3. Every RUN of those stages is valid ``sh`` (checked by ``sh -n``) and invokes only what
    its base has: python3 (pip as ``python3 -m pip``) and, on an engine's base, ``sh``."""
    stages = dockerfile.parse(DOCKERFILE, build_args)
    image = dockerfile.stage(stages, target)
    assert image.base == build_args.get("BASE_IMAGE", stages[-1].base)
    needed = dockerfile.needs(stages, image)
    expected = {"sidecar": ["build", "sidecar"], "engine": ["worker-wheel", "engine"]}
    assert [s.name for s in needed] == expected[target]
    for stage in needed:
        for run in stage.all("RUN"):
            script = run.shell()
            checked = subprocess.run(["sh", "-n", "-c", script], capture_output=True,
                                     text=True, check=False)
            assert checked.returncode == 0, f"line {run.line}: {checked.stderr}"
            programs = {words[0] for words in dockerfile.commands(script)}
            allowed = PROGRAMS[_kind(stage.base)]
            assert programs <= allowed, (f"line {run.line} ({stage.name} on {stage.base}) "
                                         f"runs {sorted(programs - allowed)}")
            for words in dockerfile.commands(script):
                if "pip" in words:
                    assert words[:3] == ["python3", "-m", "pip"], words


def test_an_engine_image_keeps_the_engines_entrypoint_and_has_the_hook_the_manifests_run(
) -> None:
    """1. The engine target sets no ENTRYPOINT, CMD, HEALTHCHECK or EXPOSE: the engine's own
    stay.
    2. Its hook is the repository's drain_hook.py, at the path the engine container's preStop
    command runs.
    3. It runs as the manifests' engine user by default (numeric, not root), as root when
    ``ENGINE_USER=root`` is given."""
    engine = dockerfile.stage(dockerfile.parse(DOCKERFILE), "engine")
    for keyword in ("ENTRYPOINT", "CMD", "HEALTHCHECK", "EXPOSE"):
        assert engine.last(keyword) is None, keyword
    pod = _engine_pod()
    containers = pod["containers"]
    assert isinstance(containers, list)
    (container,) = [c for c in containers if c["name"] == "engine"]
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    (hook_path,) = [word for word in command if word.endswith("drain_hook.py")]
    copies = {c.words()[-1]: c.words()[-2] for c in engine.all("COPY")}
    assert hook_path in copies, f"{hook_path} is not copied into the engine image"
    assert (REPO / copies[hook_path]).resolve() == DRAIN_HOOK
    user = engine.last("USER")
    assert user is not None
    context = pod["securityContext"]
    assert isinstance(context, dict)
    assert engine.expand(user.arguments) == f"{context['runAsUser']}:{context['runAsGroup']}"
    assert int(context["runAsUser"]) != 0
    as_root = dockerfile.stage(dockerfile.parse(DOCKERFILE, {"ENGINE_USER": "root"}), "engine")
    last = as_root.last("USER")
    assert last is not None
    assert as_root.expand(last.arguments) == "root"


def _wheel_requires() -> set[str]:
    """``REQUIRES`` of worker_client_wheel.py, read from its source."""
    for node in ast.parse(WHEEL_BUILDER.read_text()).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "REQUIRES" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError("no REQUIRES in worker_client_wheel.py")


def test_worker_client_imports_only_what_its_wheel_requires() -> None:
    """The third-party modules worker_client (and the wire module it ships with) import are
    the requirements its wheel names."""
    imported: set[str] = set()
    for path in [*(REPO / "worker_client").rglob("*.py"), *(REPO / "shutdown_wire").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {
        "worker_client", "shutdown_wire", "__future__"}
    assert third_party == _wheel_requires()


def _build_wheel(out: Path) -> Path:
    done = subprocess.run([sys.executable, str(WHEEL_BUILDER), "--repo", str(REPO),
                           "--out", str(out)], capture_output=True, text=True, check=False,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip())


def test_the_worker_client_wheel_is_reproducible_and_says_what_pyproject_says(
    tmp_path: Path
) -> None:
    """1. Built twice, the wheel is the same bytes.
    2. It holds worker_client and shutdown_wire whole and nothing else of the project.
    3. Its name, version, Python requirement and requirements are pyproject.toml's (the
    latter also in requirements.txt, for the installer)."""
    first, second = _build_wheel(tmp_path / "a"), _build_wheel(tmp_path / "b")
    assert first.read_bytes() == second.read_bytes()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert first.name == (f"shutdown_coordinator_worker_client-{project['version']}"
                          "-py3-none-any.whl")
    with zipfile.ZipFile(first) as wheel:
        names = wheel.namelist()
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        lines = wheel.read(meta).decode().splitlines()
    sources = {p.relative_to(REPO).as_posix()
               for package in ("worker_client", "shutdown_wire")
               for p in (REPO / package).rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    assert {n for n in names if not n.split("/")[0].endswith(".dist-info")} == sources
    wanted = [d for d in project["dependencies"]
              if Requirement(d).name in ("tenacity",)]
    assert [line.split(": ", 1)[1] for line in lines if line.startswith("Requires-Dist:")] \
        == wanted
    assert f"Version: {project['version']}" in lines
    assert f"Requires-Python: {project['requires-python']}" in lines
    assert (tmp_path / "a" / "requirements.txt").read_text().split() == wanted


def _copy_installed(names: tuple[str, ...], into: Path) -> None:
    """Copy the installed files of ``names`` and of everything they need (as installed here)
    into ``into``: what an engine image that already has them holds."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        dist = metadata.distribution(name)
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        for text in dist.requires or ():
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
        for file in dist.files or ():
            if str(file).startswith("..") or "__pycache__" in file.parts:
                continue
            source = Path(str(dist.locate_file(file)))
            if source.is_file():
                target = into / str(file)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)


def _installer(env: dict[str, str], wheels: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", str(INSTALLER), str(wheels)], env=env, capture_output=True,
                          text=True, check=False, timeout=300)


def test_the_installer_puts_worker_client_into_an_engine_python_that_has_no_pip(
    tmp_path: Path
) -> None:
    """1. An engine's Python: a virtual environment without pip (as uv makes them), which
    already has tenacity (its installed files, as engine images carry them) and
    nothing of this project.
    2. The installer runs with it as ``python3`` on PATH, offline (``PIP_NO_INDEX``), with
    the repository's hook and a wheel built by worker_client_wheel.py.
    3. It bootstraps pip with ensurepip, installs the wheel by its file, finds the
    requirements met, and the engine's Python then imports worker_client from its own
    site-packages, knows the distribution's version, and has no ``coordinator``."""
    wheels = tmp_path / "wheels"
    _build_wheel(wheels)
    engine = tmp_path / "engine"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(engine)], check=True,
                   timeout=120)
    python = engine / "bin" / "python3"
    purelib = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True).stdout.strip())
    assert not (purelib / "pip").exists()
    deps = tmp_path / "engine-packages"
    _copy_installed(("tenacity",), deps)
    (purelib / "engine-packages.pth").write_text(f"{deps}\n")
    path = f"{engine / 'bin'}:/usr/bin:/bin"
    env = {"PATH": path, "HOME": str(tmp_path), "PIP_NO_INDEX": "1",
           "PIP_CONFIG_FILE": os.devnull, "HOOK": str(DRAIN_HOOK), "LC_ALL": "C.UTF-8"}
    done = _installer(env, wheels)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Requirement already satisfied: tenacity" in done.stdout
    if shutil.which("uv", path=path) is None:
        assert "installing with pip" in done.stdout
        assert (purelib / "pip").is_dir()  # bootstrapped by ensurepip
    probe = ("import importlib.metadata as m, importlib.util as u, worker_client; "
             "print(worker_client.__file__); "
             "print(m.version('shutdown-coordinator-worker-client')); "
             "print(u.find_spec('coordinator') is None)")
    seen = subprocess.run([str(python), "-c", probe], capture_output=True, text=True,
                          check=True, cwd=tmp_path, env={"PATH": path}).stdout.split()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert Path(seen[0]).is_relative_to(purelib), seen[0]
    assert seen[1:] == [project["version"], "True"]


def test_the_installer_checks_the_hook_and_its_settings_before_installing(
    tmp_path: Path
) -> None:
    """1. ``WORKER_CLIENT=0``: the hook compiles with the engine's Python, nothing is
    installed, exit 0.
    2. A hook that does not compile, an unknown ``WORKER_CLIENT``, or an ``ENGINE_PYTHON``
    that is not there: exit 1, saying which, before anything is installed."""
    base = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PIP_NO_INDEX": "1",
            "PIP_CONFIG_FILE": os.devnull, "ENGINE_PYTHON": sys.executable,
            "HOOK": str(DRAIN_HOOK)}
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    done = _installer({**base, "WORKER_CLIENT": "0"}, empty)
    assert done.returncode == 0, done.stderr
    assert "the preStop hook only" in done.stdout
    broken = tmp_path / "drain_hook.py"
    broken.write_text("def (:\n")
    cases = [
        ({"HOOK": str(broken), "WORKER_CLIENT": "0"}, "does not compile"),
        ({"WORKER_CLIENT": "yes"}, "WORKER_CLIENT must be 0 or 1"),
        ({"ENGINE_PYTHON": "no-such-python3"}, "no 'no-such-python3' in this image"),
    ]
    for change, said in cases:
        done = _installer({**base, **change}, empty)
        assert done.returncode == 1, (change, done.stdout, done.stderr)
        assert said in done.stderr, (change, done.stderr)


def _doc_commands() -> list[list[str]]:
    text = IMAGE_DOC.read_text().replace("\\\n", " ")
    return [shlex.split(line.strip(), comments=True) for line in text.splitlines()
            if line.strip().startswith(("docker build ", "podman build "))]


def test_the_image_doc_builds_with_targets_and_arguments_the_recipe_has() -> None:
    """Each ``docker build`` and ``podman build`` in docs/image.md uses this recipe, a
    ``--target`` it has and ``--build-arg``s it declares; both variants are shown."""
    names = {s.name for s in dockerfile.parse(DOCKERFILE)}
    declared = set(re.findall(r"^\s*ARG\s+([A-Za-z_][A-Za-z0-9_]*)", DOCKERFILE.read_text(),
                              re.M))
    builds = _doc_commands()
    targets = set()
    for words in builds:
        assert words[words.index("-f") + 1] == "deploy/container/Dockerfile", words
        if "--target" in words:
            targets.add(words[words.index("--target") + 1])
        for index, word in enumerate(words):
            if word == "--build-arg":
                assert words[index + 1].split("=", 1)[0] in declared, words
    assert targets <= names
    assert "engine" in targets
    assert any("--target" not in words for words in builds)  # the default: the sidecar


@pytest.mark.skipif(kubectl() is None, reason="kubectl is needed to render the overlays")
def test_the_image_docs_overlay_images_block_sets_both_images(tmp_path: Path) -> None:
    """1. The ``images:`` block of docs/image.md, added to a copy of the vllm overlay.
    2. ``kubectl kustomize`` renders the coordinator and the engine with the images it names
    (its ``name``s match what the base and the engine component set)."""
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", IMAGE_DOC.read_text(), re.S)
                if "images:" in b]
    images = yaml.safe_load(block)["images"]
    root = rendering.stage(tmp_path)
    overlay = root / "overlays" / "vllm" / "kustomization.yaml"
    overlay.write_text(overlay.read_text() + block)
    done = subprocess.run([str(kubectl()), "kustomize", str(overlay.parent)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    rendered = set(re.findall(r"^\s*image:\s*(\S+)", done.stdout, re.M))
    assert rendered == {f"{i['newName']}:{i['newTag']}" for i in images}, rendered
