"""What ``serve`` says about its settings before it listens: refusals in the operator's words
(the flag and its environment variable, never an internal field name), warnings for settings
that are legal but probably not meant, and the effective settings it runs with.

    refusals (exit 2, nothing listens)
    ├── a value outside its bounds, or of the wrong type        (--grace-period -1)
    ├── a pattern RE2 does not accept                           (--adopt-pattern '([x')
    ├── a router written wrong                                  (--router nginx=http://x)
    ├── a safety margin that leaves no budget                   (--safety-margin >= --grace-period)
    ├── an smg or vllm-router router without --router-worker-url (nothing to name to it)
    └── a --router-token-file that is empty or cannot be read

    warnings (logged at start, also on stderr)
    ├── an environment variable with the prefix that names no setting
    │   (SHUTDOWN_COORDINATOR_GRACE_PERIOD: did you mean ..._GRACE_PERIOD_S?)
    └── an --adopt-pid that names no running process (it may start later: looked for again
        at each scan and when the drain starts)
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from coordinator.drain.budget import split_budget, too_short_for_a_tier, total_budget
from coordinator.engines import PROFILES
from coordinator.router_settings import NEEDS_WORKER_URL
from coordinator.settings import ENV_PREFIX, Settings

CLIENT_VARIABLES = frozenset({"URL", "TOKEN", "TOKEN_FILE"})
"""Variables of the client commands (``drain``, ``status``): not settings of ``serve``."""


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def explain(error: ValidationError, flags: Mapping[str, str]) -> list[str]:
    """One line per invalid setting: its flag and environment variable, what is wrong, and
    the value given (``flags``: field name to flag)."""
    lines = []
    for item in error.errors():
        field = str(item["loc"][0]) if item.get("loc") else ""
        where = f"{flags[field]} (env {env_name(field)})" if field in flags else (
            f"env {env_name(field)}" if field else "settings")
        message = str(item.get("msg", "invalid")).removeprefix("Value error, ")
        given = item.get("input")
        shown = f" (given: {given!r})" if isinstance(given, (str, int, float)) else ""
        if isinstance(given, list) and given:
            shown = f" (given: {', '.join(repr(g) for g in given)})"
        lines.append(f"{where}: {message}{shown}")
    return lines


def refusals(settings: Settings) -> list[str]:
    """Settings that are each valid but together make no sense."""
    problems = []
    if settings.safety_margin_s >= settings.grace_period_s:
        problems.append(
            f"--safety-margin {settings.safety_margin_s:g} is not less than --grace-period "
            f"{settings.grace_period_s:g}: the drain would have no time of its own (the "
            "budget is the grace period minus the margin)")
    problems.extend(router_refusals(settings))
    return problems


def router_refusals(settings: Settings) -> list[str]:
    """Routers that could not be told anything: no worker URL to name, no key to send."""
    problems = []
    naming = sorted({r.kind for r in settings.routers} & NEEDS_WORKER_URL)
    if naming and settings.router_worker_url is None:
        problems.append(
            f"--router {', '.join(naming)} needs --router-worker-url (env "
            f"{env_name('router_worker_url')}): the engine's URL as the router knows it "
            "(http://POD_IP:PORT), or the router cannot be told which worker drains")
    if settings.router_token_file is not None:
        try:
            read_router_token(settings)
        except ValueError as exc:
            problems.append(str(exc))
    return problems


def read_router_token(settings: Settings) -> str | None:
    """smg's control-plane key from ``--router-token-file``; ``ValueError`` in the operator's
    words when the file is empty or cannot be read."""
    path = settings.router_token_file
    if path is None:
        return None
    where = f"--router-token-file {path} (env {env_name('router_token_file')})"
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{where}: cannot be read ({exc})") from exc
    if not token:
        raise ValueError(f"{where} is empty: write smg's control-plane key into it, or "
                         "remove the setting to send none")
    return token


def unknown_variables(environ: Mapping[str, str], fields: Iterable[str]) -> list[str]:
    """A warning for each ``SHUTDOWN_COORDINATOR_*`` variable that names no setting."""
    known = {name.upper() for name in fields} | CLIENT_VARIABLES
    warnings = []
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX):
            continue
        suffix = name.removeprefix(ENV_PREFIX)
        if suffix in known:
            continue
        close = difflib.get_close_matches(suffix, known, n=1, cutoff=0.6)
        hint = f"; did you mean {ENV_PREFIX}{close[0]}?" if close else ""
        warnings.append(f"environment variable {name} names no setting and is ignored{hint}")
    return warnings


def missing_adopt_pids(pids: Sequence[int]) -> list[str]:
    return [f"--adopt-pid {pid}: no such process now; it is looked for again at each scan "
            "and when a drain starts" for pid in pids if not os.path.exists(f"/proc/{pid}")]


def warnings(settings: Settings, environ: Mapping[str, str]) -> list[str]:
    return [*unknown_variables(environ, Settings.model_fields),
            *missing_adopt_pids(settings.adopt_pids), *short_budget(settings)]


def short_budget(settings: Settings) -> list[str]:
    """A budget shorter than one kill tier (``budget.too_short_for_a_tier``), named by the
    settings that make it."""
    split = split_budget(total_budget(settings.grace_period_s, settings.safety_margin_s),
                         tier_timeout_s=settings.tier_timeout_s, confirm_s=settings.confirm_s,
                         termination_share=settings.termination_share,
                         min_drain_s=settings.min_drain_s,
                         main_exit_s=PROFILES[settings.engine].main_exit_s)
    warning = too_short_for_a_tier(split, tier_timeout_s=settings.tier_timeout_s)
    if warning is None:
        return []
    return [f"--grace-period {settings.grace_period_s:g} --safety-margin "
            f"{settings.safety_margin_s:g}: {warning}"]


def effective(settings: Settings) -> dict[str, Any]:
    """The settings a drain runs with, as the start-up log line shows them."""
    budget = split_budget(total_budget(settings.grace_period_s, settings.safety_margin_s),
                          tier_timeout_s=settings.tier_timeout_s, confirm_s=settings.confirm_s,
                          termination_share=settings.termination_share,
                          min_drain_s=settings.min_drain_s,
                          main_exit_s=PROFILES[settings.engine].main_exit_s)
    return {
        "engine": settings.engine,
        "budget_s": round(budget.total_s, 3),
        "migration_s": round(budget.migration_s, 3),
        "termination_s": round(budget.termination_s, 3),
        "min_drain_s": round(budget.min_drain_s, 3),
        "tier_timeout_s": settings.tier_timeout_s,
        "adopt_pids": list(settings.adopt_pids),
        "adopt_patterns": list(settings.adopt_patterns),
        "adopt_tiers": [t.name for t in settings.adopt_tiers],
        "state_file": str(settings.state_file) if settings.state_file else None,
        "engine_metrics_url": settings.engine_metrics_url,
        "routers": [str(r) for r in settings.routers],
        "router_worker_url": settings.router_worker_url,
    }
