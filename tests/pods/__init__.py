"""Pods as the kubelet runs them, on a real container runtime (podman with runc).

Test scenery, not the product: the images the manifests name, built from a Debian base made
here (``images``); a pod runner that starts and deletes a rendered pod the way the kubelet
does (``kubelet``); and what the tests read the truth from: the runtime's own records of each
container (``podman inspect``), and the kernel's record of every process's end in the pod
(``exits``). docs/deploy.md ("Pods on a real container runtime") says what this reproduces of
the kubelet and what it does not.
"""
