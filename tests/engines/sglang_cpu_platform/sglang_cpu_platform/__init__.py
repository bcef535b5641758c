"""SGLang on this CPU through its out-of-tree platform interface (test scenery).

SGLang resolves its platform in ``sglang/srt/platforms/__init__.py``: every entry point of the
group ``sglang.srt.platforms`` is loaded and called, and the one that returns a class name is
the platform. This one always answers: it is installed only into the test virtualenv of a
machine without an accelerator.
"""

PLATFORM = "sglang_cpu_platform.platform:NativeCpuPlatform"


def activate() -> str:
    return PLATFORM
