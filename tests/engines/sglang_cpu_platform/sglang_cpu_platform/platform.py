"""The platform class: SGLang's CPU device operations with its torch-native kernels.

``CpuDeviceMixin`` gives the CPU device operations (memory from psutil, gloo for
torch.distributed); the out-of-tree enum keeps SGLang off its in-tree CPU engine, whose fused
ops import a CPU build of sgl-kernel. Every fused op then runs its ``forward_native``
(``get_dispatch_key_name``), attention runs on ``torch_native``, and nothing is pinned.
"""

from typing import Any

from sglang.srt.platforms.cpu import CpuDeviceMixin
from sglang.srt.platforms.device_mixin import PlatformEnum
from sglang.srt.platforms.interface import SRTPlatform


class NativeCpuPlatform(CpuDeviceMixin, SRTPlatform):  # type: ignore[misc]
    _enum = PlatformEnum.OOT

    def get_default_attention_backend(self) -> str:
        return "torch_native"

    def get_dispatch_key_name(self) -> str:
        return "native"

    def is_pin_memory_available(self, device: Any = None) -> bool:
        return False
