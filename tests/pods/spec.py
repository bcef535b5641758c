"""A pod's spec turned into what podman runs, as the kubelet turns it into a CRI config.

What is followed (kubelet at kubernetes@fbba6b47 unless said):

- the environment: ``envFrom`` first, then ``env`` in order, each ``$(VAR)`` expanded against
  what is defined before it (``$$`` escapes), ``valueFrom`` read from a ConfigMap, a Secret,
  the pod's fields (the downward API) or the container's resources
  (``pkg/kubelet/kubelet_pods.go`` ``makeEnvironmentVariables``,
  ``third_party/forked/golang/expansion``); command and args expanded against the result
  (``kubecontainer.ExpandContainerCommandAndArgs``, ``generateContainerConfig``);
- ``command`` replaces the image's ENTRYPOINT and drops its CMD; ``args`` alone replace CMD;
- the user: ``runAsUser``/``runAsGroup`` of the container, else of the pod; ``fsGroup`` and
  ``supplementalGroups`` as supplementary groups; ``runAsNonRoot`` checked against the
  effective user, the image's when none is set, which must then be numeric
  (``verifyRunAsNonRoot``, ``pkg/kubelet/kuberuntime/security_context_others.go``);
- ``capabilities`` (drop, then add), ``allowPrivilegeEscalation: false``
  (``no_new_privs``), ``readOnlyRootFilesystem`` (and nothing writable added for it:
  podman's ``--read-only-tmpfs`` is turned off), ``privileged``, ``seccompProfile``;
- volumes: Secret and ConfigMap files with their ``defaultMode``, group-owned by ``fsGroup``
  and group-readable (``pkg/volume/volume_linux.go`` ``SetVolumeOwnership``); ``emptyDir`` a
  0777 directory (``medium: Memory``: a tmpfs of ``sizeLimit``) owned likewise, setgid;
  ``hostPath``; each mounted read-only where the mount says so;
- ``resources.limits.memory`` (``--memory``); no pids limit (the kubelet's default
  ``podPidsLimit`` is unlimited, podman's 2048).

Not reproduced: Service environment variables, projected and other volume types,
``subPath``, ``resources.requests`` and extended resources (``nvidia.com/gpu``: no GPU here),
``terminationMessagePath``, image pulls (images must be present: ``imagePullPolicy`` is
treated as ``Never``).
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.pods.podman import PODS_DIR, owner, owner_alive

MOUNTS = PODS_DIR / "mounts"
"""Where each test process lists the tmpfs volumes it mounted."""
POD_IP = "10.244.0.10"
"""The pod's IP: an address of the pod network namespace's loopback (there is no CNI)."""
HOST_IP = "10.244.0.1"
NODE_NAME = "podman-node"
NAMESPACE = "default"
_EXPANSION = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "": 1,
           "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


class CreateContainerConfigError(Exception):
    """What the kubelet reports as ``CreateContainerConfigError`` (the container is not
    created): a missing key, a non-root policy the user breaks."""


@dataclass(frozen=True)
class PodMeta:
    """The pod's own fields the downward API gives."""

    name: str
    uid: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    namespace: str = NAMESPACE
    service_account: str = "default"
    ip: str = POD_IP
    """``status.podIP``: ``POD_IP`` on the pod's loopback, or its address on a
    ``network.ClusterNetwork``."""
    host_ip: str = HOST_IP

    def field(self, path: str) -> str:
        """``valueFrom.fieldRef.fieldPath`` (``podFieldSelectorRuntimeValue``)."""
        simple = {"metadata.name": self.name, "metadata.namespace": self.namespace,
                  "metadata.uid": self.uid, "spec.nodeName": NODE_NAME,
                  "spec.serviceAccountName": self.service_account, "status.podIP": self.ip,
                  "status.podIPs": self.ip, "status.hostIP": self.host_ip,
                  "status.hostIPs": self.host_ip}
        if path in simple:
            return simple[path]
        match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
        if match:
            source = self.labels if match.group(1) == "labels" else self.annotations
            return source.get(match.group(2), "")
        raise CreateContainerConfigError(f"unsupported fieldRef {path!r}")


@dataclass
class Objects:
    """The ConfigMaps and Secrets the pod may name, by name: ``data`` as strings."""

    config_maps: dict[str, dict[str, str]] = field(default_factory=dict)
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def of(cls, docs: list[dict[str, Any]]) -> Objects:
        objects = cls()
        for doc in docs:
            name = doc["metadata"]["name"]
            if doc.get("kind") == "ConfigMap":
                objects.config_maps[name] = dict(doc.get("data") or {})
            elif doc.get("kind") == "Secret":
                data = {k: base64.b64decode(v).decode() for k, v in (doc.get("data") or {}).items()}
                data.update(doc.get("stringData") or {})
                objects.secrets[name] = data
        return objects

    def key(self, kind: str, ref: Mapping[str, Any]) -> str | None:
        source = self.config_maps if kind == "configMap" else self.secrets
        found = source.get(ref["name"])
        if found is None or ref["key"] not in found:
            if ref.get("optional"):
                return None
            raise CreateContainerConfigError(
                f"{kind} {ref['name']!r}: no key {ref['key']!r}" if found is not None
                else f"{kind} {ref['name']!r} not found")
        return found[ref["key"]]


def expand(value: str, env: Mapping[str, str]) -> str:
    """``$(VAR)`` replaced by ``env[VAR]`` when defined (else kept), ``$$`` by ``$``."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return _EXPANSION.sub(one, value)


def quantity(text: str | int) -> int:
    """A resource quantity (``256Mi``, ``1G``, ``500m`` cores are not bytes) as a number."""
    match = _QUANTITY.match(str(text))
    if not match or match.group(2) not in _BINARY:
        raise CreateContainerConfigError(f"unsupported quantity {text!r}")
    return int(float(match.group(1)) * _BINARY[match.group(2)])


def cpus(text: str | int | float) -> float:
    """A CPU quantity (``500m``, ``2``) in cores."""
    match = re.fullmatch(r"([0-9.]+)(m?)", str(text))
    if not match:
        raise CreateContainerConfigError(f"unsupported CPU quantity {text!r}")
    return float(match.group(1)) / (1000 if match.group(2) else 1)


def environment(container: Mapping[str, Any], meta: PodMeta, objects: Objects) -> dict[str, str]:
    """The container's environment as the kubelet makes it (order kept)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        if "configMapRef" in source:
            ref, data = source["configMapRef"], objects.config_maps.get(
                source["configMapRef"]["name"])
        else:
            ref, data = source["secretRef"], objects.secrets.get(source["secretRef"]["name"])
        if data is None:
            if ref.get("optional"):
                continue
            raise CreateContainerConfigError(f"{ref['name']!r} not found")
        for key, value in data.items():
            if _ENV_NAME.match(prefix + key):
                env[prefix + key] = value
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item or "valueFrom" not in item:
            env[name] = expand(str(item.get("value", "")), env)
            continue
        source = item["valueFrom"]
        found: str | None
        if "fieldRef" in source:
            found = meta.field(source["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in source:
            ref = source["resourceFieldRef"]
            limit = (container.get("resources") or {}).get("limits", {}).get(
                ref["resource"].split(".", 1)[1])
            found = str(quantity(limit) // quantity(ref.get("divisor", 1))) if limit else "0"
        elif "configMapKeyRef" in source:
            found = objects.key("configMap", source["configMapKeyRef"])
        else:
            found = objects.key("secret", source["secretKeyRef"])
        if found is not None:
            env[name] = found
    return env


def security(pod: Mapping[str, Any], container: Mapping[str, Any], field_name: str) -> Any:
    """A security setting as it applies to the container: its own, else the pod's."""
    own = container.get("securityContext") or {}
    if field_name in own:
        return own[field_name]
    return (pod.get("securityContext") or {}).get(field_name)


def user_flag(pod: Mapping[str, Any], container: Mapping[str, Any], image_user: str) -> str | None:
    """``--user`` for podman (None: the image's), after the kubelet's non-root check."""
    uid = security(pod, container, "runAsUser")
    gid = security(pod, container, "runAsGroup")
    if security(pod, container, "runAsNonRoot"):
        if uid is not None:
            if int(uid) == 0:
                raise CreateContainerConfigError(
                    "container's runAsUser breaks non-root policy")
        else:
            name = image_user.split(":", 1)[0] or "0"
            if not name.isdigit():
                raise CreateContainerConfigError(
                    f"container has runAsNonRoot and image has non-numeric user ({name}), "
                    "cannot verify user is non-root")
            if int(name) == 0:
                raise CreateContainerConfigError(
                    "container has runAsNonRoot and image will run as root")
    if uid is None and gid is None:
        return None
    user = str(uid) if uid is not None else (image_user.split(":", 1)[0] or "0")
    return f"{user}:{gid}" if gid is not None else user


@dataclass(frozen=True)
class Volume:
    """A pod volume made on the host: what to bind into a container."""

    name: str
    source: Path
    read_only: bool = False
    """Mounted read-only whatever the volumeMount says (Secret, ConfigMap)."""
    tmpfs: bool = False


def _owned(path: Path, fs_group: int | None, mode: int) -> None:
    if fs_group is not None:
        os.chown(path, -1, fs_group)
    os.chmod(path, mode)


def _projected_files(directory: Path, data: Mapping[str, str], spec: Mapping[str, Any],
                     fs_group: int | None, default_mode: int) -> None:
    """Secret or ConfigMap keys as files (``items`` choose and rename them)."""
    directory.mkdir(parents=True)
    mode = int(spec.get("defaultMode", default_mode))
    items = spec.get("items") or [{"key": k, "path": k} for k in sorted(data)]
    for item in items:
        if item["key"] not in data:
            if spec.get("optional"):
                continue
            raise CreateContainerConfigError(f"no key {item['key']!r}")
        target = directory / item["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(data[item["key"]])
        file_mode = int(item.get("mode", mode))
        # SetVolumeOwnership: a read-only volume's files are group-readable by fsGroup.
        _owned(target, fs_group, file_mode | (0o440 if fs_group is not None else 0))
    _owned(directory, fs_group, 0o755 | (0o2000 if fs_group is not None else 0))


def make_volume(spec: Mapping[str, Any], where: Path, objects: Objects,
                fs_group: int | None) -> Volume:
    """Make one pod volume under ``where`` (the pod's directory on the host)."""
    name = spec["name"]
    directory = where / name
    for kind, store, key in (("secret", objects.secrets, "secretName"),
                             ("configMap", objects.config_maps, "name")):
        if kind in spec:
            source = spec[kind]
            data = store.get(source[key])
            if data is None:
                raise CreateContainerConfigError(f"{kind} {source[key]!r} not found")
            _projected_files(directory, data, source, fs_group, 0o644)
            return Volume(name, directory, read_only=True)
    if "emptyDir" in spec:
        source = spec["emptyDir"] or {}
        directory.mkdir(parents=True)
        memory = source.get("medium") == "Memory"
        if memory:
            options = [f"mode={0o2777 if fs_group is not None else 0o777:o}"]
            if fs_group is not None:
                options.append(f"gid={fs_group}")
            if source.get("sizeLimit"):
                options.append(f"size={quantity(source['sizeLimit'])}")
            subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs",
                            str(directory)], check=True, timeout=30)
            remember_mount(directory)
        else:
            _owned(directory, fs_group, 0o777 | (0o2000 if fs_group is not None else 0))
        return Volume(name, directory, tmpfs=memory)
    if "hostPath" in spec:
        return Volume(name, Path(spec["hostPath"]["path"]))
    raise CreateContainerConfigError(f"unsupported volume {json.dumps(dict(spec))}")


def remember_mount(directory: Path) -> None:
    """Note a tmpfs this test process mounted, for ``unmount_leftovers`` should the process
    die before it unmounts it."""
    MOUNTS.mkdir(parents=True, exist_ok=True)
    with (MOUNTS / f"{owner().replace(':', '-')}.txt").open("a") as out:
        out.write(f"{directory.resolve()}\n")


def unmount_leftovers() -> None:
    """Unmount the tmpfs volumes of test processes that are gone (``remember_mount``)."""
    if not MOUNTS.is_dir():
        return
    for listing in MOUNTS.glob("*.txt"):
        pid, _, ticks = listing.stem.partition("-")
        if owner() == f"{pid}:{ticks}" or owner_alive(pid, ticks):
            continue
        for line in listing.read_text().splitlines():
            if line.strip():
                unmount_volumes(Path(line).parent)
        listing.unlink()


def unmount_volumes(where: Path) -> None:
    """Unmount every tmpfs made under ``where`` (the pod's directory)."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return
    prefix = str(where.resolve()) + "/"
    for line in mounts:
        target = line.split()[1].replace("\\040", " ")
        if target.startswith(prefix):
            subprocess.run(["umount", "-l", target], check=False, timeout=30)


def hosts_file(pod: Mapping[str, Any], meta: PodMeta) -> str:
    """The pod's ``/etc/hosts`` as the kubelet writes it (``managedHostsFileContent``,
    ``pkg/kubelet/kubelet_pods.go``): loopback, the pod's IP and hostname, then its
    ``hostAliases``. The kubelet mounts it into every container (``makeHostsMount``)."""
    lines = ["# Kubernetes-managed hosts file.", "127.0.0.1\tlocalhost",
             "::1\tlocalhost ip6-localhost ip6-loopback", "fe00::0\tip6-localnet",
             "fe00::0\tip6-mcastprefix", "fe00::1\tip6-allnodes", "fe00::2\tip6-allrouters",
             f"{meta.ip}\t{meta.name}"]
    aliases = pod.get("hostAliases") or []
    if aliases:
        lines += ["", "# Entries added by HostAliases."]
        lines += [f"{a['ip']}\t{chr(9).join(a.get('hostnames') or [])}" for a in aliases]
    return "\n".join(lines) + "\n"


def podman_create_args(pod: Mapping[str, Any], container: Mapping[str, Any], *,
                       meta: PodMeta, objects: Objects, volumes: Mapping[str, Volume],
                       image_user: str, hosts_file: Path | None = None) -> list[str]:
    """The ``podman create`` options and arguments for one container (after the pod's and
    the name's), as the kubelet's CRI config would set them (``hosts_file``: the pod's
    ``/etc/hosts``, ``hosts_file()``)."""
    env = environment(container, meta, objects)
    args: list[str] = ["--no-healthcheck", "--pids-limit", "-1", "--restart", "no",
                       "--pull", "never"]
    for key, value in env.items():
        args += ["--env", f"{key}={value}"]
    user = user_flag(pod, container, image_user)
    if user is not None:
        args += ["--user", user]
    groups = [security(pod, {}, "fsGroup"),
              *((pod.get("securityContext") or {}).get("supplementalGroups") or [])]
    for group in groups:
        if group is not None:
            args += ["--group-add", str(group)]
    caps = security(pod, container, "capabilities") or {}
    for cap in caps.get("drop") or []:
        args += ["--cap-drop", cap]
    # containerd and CRI-O put added capabilities in the bounding, permitted and effective
    # sets, which a non-root process loses at its exec: Kubernetes has no ambient
    # capabilities (kubernetes#56374). podman puts them in the ambient set for a non-root
    # user, where they stay effective; so they are not given to one here.
    uid = (user or image_user).split(":", 1)[0] or "0"
    if uid == "root" or (uid.isdigit() and int(uid) == 0):
        for cap in caps.get("add") or []:
            args += ["--cap-add", cap]
    if security(pod, container, "allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    if security(pod, container, "privileged"):
        args += ["--privileged"]
    seccomp = (security(pod, container, "seccompProfile") or {}).get("type", "Unconfined")
    if seccomp == "Unconfined":
        args += ["--security-opt", "seccomp=unconfined"]
    if security(pod, container, "readOnlyRootFilesystem"):
        args += ["--read-only", "--read-only-tmpfs=false"]
    limits = (container.get("resources") or {}).get("limits") or {}
    if "memory" in limits:
        args += ["--memory", str(quantity(limits["memory"]))]
    if "cpu" in limits:
        # The kubelet's CPU limit is a CFS quota per period, as podman's --cpus sets it.
        args += ["--cpus", f"{cpus(limits['cpu']):g}"]
    if container.get("workingDir"):
        args += ["--workdir", container["workingDir"]]
    for mount in container.get("volumeMounts") or []:
        volume = volumes[mount["name"]]
        read_only = volume.read_only or bool(mount.get("readOnly"))
        args += ["--mount", f"type=bind,source={volume.source},destination="
                            f"{mount['mountPath']}{',ro=true' if read_only else ''}"]
    if hosts_file is not None:
        args += ["--mount", f"type=bind,source={hosts_file},destination=/etc/hosts"]
    command = [expand(str(c), env) for c in container.get("command") or []]
    arguments = [expand(str(a), env) for a in container.get("args") or []]
    if command:
        args += ["--entrypoint", json.dumps(command)]
    args.append(container["image"])
    args += arguments
    return args
