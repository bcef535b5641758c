"""docs/deploy.md's table of pod deletions, from the outcomes the overlay pod tests saved.

    python -m tests.pods.report            # the Markdown table, from PODS_DIR/results

One row per overlay and strategy: each container's exit code as the runtime recorded it,
the preStop hook's result, how every process of the pod ended by the kernel's record, the
stream as its client read it, the time from the deletion to the pod gone against the grace
period, and what the coordinator concluded.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from tests.pods.overlays import INIT, RESULTS, STRATEGIES

OVERLAYS = ("vllm", "adopted-vllm", "vllm-init", "sglang", "dynamo-worker", "trtllm")
HEADER = ("| overlay | strategy | engine exit | sidecar exit | preStop hook | processes (kernel) "
          "| stream | deleted → gone / grace | coordinator |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- |")


def processes(outcome: dict[str, Any]) -> str:
    """``4 x exit 0`` or each process that did not exit 0, by name."""
    ends = outcome["processes"]
    fine = [p for p in ends if p["end"] == "exit 0"]
    other = [f"{p['name']} ({p['pod_pid']}): {p['end']}" for p in ends if p["end"] != "exit 0"]
    counted = Counter(p["end"] for p in fine)
    parts = [f"{n} x {end}" for end, n in counted.items()]
    return "; ".join([*parts, *other]) or "none"


def coordinator(outcome: dict[str, Any]) -> str:
    drain = outcome.get("drain")
    if outcome["strategy"] not in ("sidecar", INIT):
        return "—"
    if not drain or not drain.get("drain"):
        return "no summary"
    summary = drain["drain"]
    causes = "; ".join(summary.get("causes") or [])
    return str(summary["outcome"]) + (f" ({causes})" if causes else "")


def row(outcome: dict[str, Any]) -> str:
    def code(value: int | None) -> str:
        return "—" if value is None else str(value)

    stream = outcome["stream"] + ("" if outcome["stream"] != "cut"
                                  else f" after {outcome['stream_tokens']} tokens")
    sigkill = " (runtime SIGKILL)" if "engine" in outcome["runtime_sigkill"] else ""
    load = outcome.get("load_average")
    seconds = f"{outcome['seconds']:.1f} s / {outcome['grace_period']} s" + (
        "" if load is None else f" (load {load:g})")
    return (f"| {outcome['overlay']} | {outcome['strategy']} | "
            f"{code(outcome['engine_exit'])}{sigkill} | {code(outcome['sidecar_exit'])} | "
            f"{outcome['hook']} | {processes(outcome)} | {stream} | "
            f"{seconds} | "
            f"{coordinator(outcome)} |")


def table(results: Path = RESULTS) -> str:
    lines = [HEADER]
    for overlay in OVERLAYS:
        for strategy in (*STRATEGIES, INIT):
            path = results / f"{overlay}-{strategy}.json"
            if path.exists():
                lines.append(row(json.loads(path.read_text())))
    return "\n".join(lines)


def main() -> int:
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
