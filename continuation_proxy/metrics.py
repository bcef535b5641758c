"""The proxy's counters in Prometheus' text format (written by hand: a dozen lines)."""

from __future__ import annotations

from router_client import ContinuationStats, Refusal

PREFIX = "continuation_proxy"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_COUNTERS = (
    ("streams", "Requests taken (streamed or not)."),
    ("completed", "Requests that ended whole ([DONE], or collected)."),
    ("continuations", "Upstream attempts that continued a stream."),
    ("handed_back", "Upstream attempts that ended with the handed-back event."),
    ("broken", "Upstream streams that broke after they started (no [DONE])."),
    ("ended", "Upstream streams a draining pod's engine aborted while its coordinator ended "
              "streams (--end-streams)."),
    ("upstream_retries", "Refused upstream attempts tried again."),
    ("tokens", "Tokens sent to clients."),
    ("acked", "Handoffs a coordinator took (acknowledged, or remembered early)."),
    ("ended_acked", "Streams ended by a drain and taken over, counted continued by it."),
    ("ended_ambiguous", "Streams ended and taken over while several drains ended streams: "
                        "acknowledged to none."),
)


def render(stats: ContinuationStats) -> str:
    """Every counter, refusals and failures labelled by reason (each refusal reason is
    always listed, at 0 when it never happened, so rates and alerts have a series)."""
    lines: list[str] = []

    def counter(name: str, text: str, samples: list[tuple[str, int]]) -> None:
        full = f"{PREFIX}_{name}_total"
        lines.extend([f"# HELP {full} {text}", f"# TYPE {full} counter"])
        lines.extend(f"{full}{labels} {value}" for labels, value in samples)

    for name, text in _COUNTERS:
        counter(name, text, [("", getattr(stats, name))])
    refused = {reason.value: 0 for reason in Refusal} | dict(stats.refused)
    counter("refused", "Handed-back streams not migrated: they cannot be continued "
            "exactly, by reason.", [(f'{{reason="{r}"}}', n) for r, n in sorted(refused.items())])
    counter("failed", "Streams that ended in an error event for another reason, by reason.",
            [(f'{{reason="{r}"}}', n) for r, n in sorted(stats.failed.items())])
    return "\n".join(lines) + "\n"
