"""The drain's outcome (``coordinator.drain.outcome``): every rule, every precedence pair."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from coordinator import exit_codes
from coordinator.drain import outcome
from coordinator.drain.outcome import (
    PRECEDENCE,
    Verdict,
    default_action_death,
    judge,
)
from coordinator.kill.report import Fate, ProcessOutcome

_pids = itertools.count(1000)


def proc(**fields: Any) -> ProcessOutcome:
    """A child (depth 1) that exited 0 after SIGTERM, unless ``fields`` say otherwise."""
    values: dict[str, Any] = {"pid": next(_pids), "name": "child", "depth": 1,
                              "fate": Fate.EXITED, "signal": "SIGTERM", "exit_code": 0}
    values.update(fields)
    return ProcessOutcome(**values)


def root(**fields: Any) -> ProcessOutcome:
    """A registered main process (depth 0) that exited 0 after SIGTERM, unless told otherwise."""
    return proc(**{"name": "engine", "depth": 0, **fields})


def test_a_clean_drain_is_graceful_with_no_causes() -> None:
    """Root and children exited 0 after SIGTERM; a child already gone (code unknown) and one
    that died of SIGTERM's default action are acceptable."""
    verdict = judge([
        proc(), proc(exit_code=-15), proc(fate=Fate.GONE, signal=None, exit_code=None),
        root(),
    ])
    assert verdict == Verdict("graceful", (), 0)
    assert verdict.graceful
    assert verdict.to_dict() == {"outcome": "graceful", "causes": [], "lost_requests": 0}


RULES: list[tuple[str, list[ProcessOutcome], dict[str, Any], str, tuple[str, ...]]] = [
    ("survived", [proc(fate=Fate.SURVIVED, killed_at=1.0, exit_code=None)], {}, "survived",
     ("did not end by the deadline, even after SIGKILL",)),
    ("still running", [proc(fate=Fate.RUNNING, exit_code=None)], {}, "survived",
     ("had not ended",)),
    ("needed SIGKILL", [proc(name="sched", fate=Fate.KILLED, exit_code=-9)], {}, "killed",
     ("Process sched (pid", "after SIGTERM and needed SIGKILL")),
    ("SIGKILL without a graceful signal", [proc(fate=Fate.KILLED, signal=None, exit_code=-9)],
     {}, "killed", ("before any graceful signal",)),
    ("force drain", [proc(fate=Fate.KILLED, signal=None, exit_code=-9)], {"force": True},
     "killed", ("force drain",)),
    ("root's own SIGKILL (kill_process_tree include_parent)",
     [root(name="sglang", exit_code=-9)], {}, "signalled",
     ("Main process sglang", "a SIGKILL sent by the engine itself, not by the coordinator "
      "(exit -9; its container reports 137)")),
    ("child SIGSEGV", [proc(exit_code=-11)], {}, "signalled", ("died of SIGSEGV (exit -11)",)),
    ("child SIGABRT", [proc(exit_code=-6)], {}, "signalled", ("SIGABRT",)),
    ("PDEATHSIG child", [proc(signal=None, exit_code=-9), root()], {}, "signalled",
     ("died of a SIGKILL sent by the engine itself, not by the coordinator",)),
    ("the engine's own SIGKILL, as its profile tells it",
     [proc(name="sglang::detokenizer", signal=None, exit_code=-9), root()],
     {"engine_kills": "SGLang kills it at every shutdown; the drainable integration ends it "
                      "cleanly."},
     "signalled", ("Process sglang::detokenizer",
                   "sent by the engine itself, not by the coordinator",
                   "(SGLang kills it at every shutdown; the drainable integration ends it "
                   "cleanly)")),
    ("a stream the kill cut", [root()], {"lost_requests": 1, "cut_requests": 1},
     "lost_requests", ("1 request the engine still had in flight by its own count when its "
                       "processes ended was cut by the kill",)),
    ("PDEATHSIG child in a force drain", [proc(signal=None, exit_code=-9)], {"force": True},
     "killed", ("died of SIGKILL during the force drain",)),
    ("child stopped by its parent with the drain's SIGTERM",
     [proc(signal=None, exit_code=-15), root()], {}, "graceful", ()),
    ("child died of SIGTERM in a drain that sent only SIGINT",
     [proc(signal=None, exit_code=-15), root(signal="SIGINT")], {}, "signalled",
     ("died of SIGTERM (exit -15)",)),
    ("child died of its tier's SIGINT", [proc(signal="SIGINT", exit_code=-2)], {}, "graceful",
     ()),
    ("child died of SIGTERM after SIGINT", [proc(signal="SIGINT", exit_code=-15)], {},
     "signalled", ("not of the SIGINT it was sent",)),
    ("child exit 1", [proc(exit_code=1)], {}, "failed", ("exited with code 1.",)),
    ("child exit 143", [proc(exit_code=143)], {}, "failed",
     ("exited with code 143 (128 + 15: how a shell reports a death by SIGTERM)",)),
    ("root died of SIGTERM's default action", [root(exit_code=-15)], {}, "failed",
     ("SIGTERM's default action (exit -15; its container reports 143)", "did not exit 0")),
    ("root exit 143", [root(exit_code=143)], {}, "failed", ("Main process", "143 (128 + 15")),
    ("root exit 2", [root(exit_code=2)], {}, "failed", ("exited with code 2.",)),
    ("root exit code unknown", [root(exit_code=None)], {}, "unverified",
     ("exit code could not be learned",)),
    ("root already gone, code unknown", [root(fate=Fate.GONE, signal=None, exit_code=None)],
     {}, "unverified", ("exit 0 cannot be confirmed",)),
    ("root already gone, exit 0", [root(fate=Fate.GONE, signal=None, exit_code=0)], {},
     "graceful", ()),
    ("child exit code unknown", [proc(exit_code=None), root()], {}, "graceful", ()),
    ("orphan of a dead root died of SIGTERM",
     [proc(depth=0, role="orphan", exit_code=-15)], {}, "graceful", ()),
    ("orphan of a dead root, code unknown",
     [proc(depth=0, role="orphan", exit_code=None)], {}, "graceful", ()),
    ("one lost request", [root()], {"lost_requests": 1}, "lost_requests",
     ("1 handed-back request expired unacknowledged",
      "its client was cut off unless one did later")),
    ("lost requests", [root()], {"lost_requests": 3}, "lost_requests",
     ("3 handed-back requests expired unacknowledged",
      "their clients were cut off unless one did later")),
    ("internal failure", [root()], {"errors": ["the kill raised OSError."]}, "error",
     ("The drain failed internally: the kill raised OSError.",)),
    ("nothing registered or adopted", [], {}, "nothing_to_drain",
     ("No process was registered or adopted",)),
]


@pytest.mark.parametrize(("processes", "options", "word", "phrases"),
                         [r[1:] for r in RULES], ids=[r[0] for r in RULES])
def test_each_rule(processes: list[ProcessOutcome], options: dict[str, Any], word: str,
                   phrases: tuple[str, ...]) -> None:
    """One case per rule: its outcome word, and its cause naming what happened."""
    verdict = judge(processes, **options)
    assert verdict.outcome == word
    assert verdict.lost_requests == options.get("lost_requests", 0)
    if word == "graceful":
        assert verdict.causes == ()
        return
    assert len(verdict.causes) == 1, verdict.causes
    for phrase in phrases:
        assert phrase in verdict.causes[0]


def _case(word: str) -> tuple[list[ProcessOutcome], dict[str, Any]]:
    """The smallest drain that gives ``word``, as (processes, judge's keywords)."""
    cases: dict[str, tuple[list[ProcessOutcome], dict[str, Any]]] = {
        "survived": ([proc(fate=Fate.SURVIVED, exit_code=None)], {}),
        "killed": ([proc(fate=Fate.KILLED, exit_code=-9)], {}),
        "signalled": ([proc(exit_code=-11)], {}),
        "failed": ([proc(exit_code=1)], {}),
        "lost_requests": ([root()], {"lost_requests": 2}),
        "error": ([root()], {"errors": ["boom"]}),
        "unverified": ([root(exit_code=None)], {}),
        "nothing_to_drain": ([], {}),
    }
    return cases[word]


def _pairs() -> list[tuple[str, str]]:
    """Every (higher, lower) pair of ``PRECEDENCE`` that can happen together: a drain with a
    process cannot also have had nothing to drain."""
    needs_process = {"survived", "killed", "signalled", "failed", "unverified"}
    return [(a, b) for a, b in itertools.combinations(PRECEDENCE, 2)
            if not (b == "nothing_to_drain" and a in needs_process)]


@pytest.mark.parametrize(("higher", "lower"), _pairs(),
                         ids=[f"{a}-over-{b}" for a, b in _pairs()])
def test_every_precedence_pair(higher: str, lower: str) -> None:
    """Both causes together: the outcome is the higher one, and both causes are listed,
    the higher first, each as it reads alone."""
    cases = {word: _case(word) for word in (higher, lower)}
    alone = {word: judge(found, **opts).causes for word, (found, opts) in cases.items()}
    processes = [*cases[lower][0], *cases[higher][0]]
    if lower == "nothing_to_drain":
        processes = []  # the higher cause (lost requests, an error) needs no process
    verdict = judge(processes, **cases[lower][1], **cases[higher][1])
    assert verdict.outcome == higher
    assert verdict.causes == (*alone[higher], *alone[lower])


def test_precedence_is_the_documented_order() -> None:
    assert PRECEDENCE == ("survived", "killed", "signalled", "failed", "lost_requests",
                          "error", "unverified", "nothing_to_drain")


def test_causes_list_every_cause_in_precedence_order() -> None:
    """One drain with every kind of cause: one sentence each (two errors: two sentences)."""
    processes = [root(exit_code=None), proc(exit_code=1), proc(exit_code=-6),
                 proc(fate=Fate.KILLED, exit_code=-9), proc(fate=Fate.SURVIVED, exit_code=None)]
    verdict = judge(processes, lost_requests=4, errors=["first", "second"])
    assert verdict.outcome == "survived"
    assert len(verdict.causes) == 8
    order = ["did not end by the deadline", "needed SIGKILL", "SIGABRT", "exited with code 1",
             "4 handed-back requests", "internally: first", "internally: second",
             "could not be learned"]
    for cause, phrase in zip(verdict.causes, order, strict=True):
        assert phrase in cause


def test_a_process_gives_one_cause_its_most_severe() -> None:
    """A SIGKILLed root (exit -9, not 0) is `killed` only, not also `failed`/`signalled`."""
    verdict = judge([root(fate=Fate.KILLED, exit_code=-9)])
    assert verdict.outcome == "killed"
    assert len(verdict.causes) == 1


def test_processes_with_the_same_cause_share_one_sentence() -> None:
    """Twelve children SIGKILLed the same way: one sentence with the count, ten named."""
    children = [proc(name=f"tp{i}", fate=Fate.KILLED, exit_code=-9) for i in range(12)]
    (cause,) = judge([*children, root()]).causes
    assert cause.startswith("12 processes did not end in time after SIGTERM")
    assert f"process tp9 (pid {children[9].pid})" in cause
    assert "tp10" not in cause
    assert cause.endswith(", and 2 more.")


def test_negative_lost_requests_are_refused() -> None:
    with pytest.raises(ValueError, match="request counts"):
        judge([root()], lost_requests=-1)
    with pytest.raises(ValueError, match="request counts"):
        judge([root()], cut_requests=-1)


def test_the_children_of_a_main_process_the_coordinator_killed_died_with_it() -> None:
    """Their SIGKILL is the coordinator's doing (PDEATHSIG of the root it SIGKILLed), not
    their engine's."""
    verdict = judge([proc(signal=None, exit_code=-9, root_pid=77),
                     root(pid=77, fate=Fate.KILLED, killed_at=1.0, exit_code=-9)],
                    engine_kills="never said of these")
    assert verdict.outcome == "killed"
    assert "needed SIGKILL" in verdict.causes[0]
    assert "died of SIGKILL with its main process, which the coordinator SIGKILLed" in (
        verdict.causes[1])
    assert "never said" not in " ".join(verdict.causes)


def test_cut_requests_are_lost_requests_with_a_sentence_of_their_own() -> None:
    """Two handoffs expired and one stream cut: three lost, each kind said on its own; a cut
    count the caller left out of the total still counts."""
    verdict = judge([root()], lost_requests=3, cut_requests=1)
    assert verdict.outcome == "lost_requests"
    assert verdict.lost_requests == 3
    assert [c.split(" ", 2)[:2] for c in verdict.causes] == [["1", "request"], ["2", "handed-back"]]
    assert judge([root()], cut_requests=2).lost_requests == 2


@pytest.mark.parametrize(("sent", "code", "expected"), [
    ("SIGTERM", -15, True),
    ("SIGINT", -2, True),
    ("SIGTERM", -9, False),
    ("SIGTERM", 0, False),
    ("SIGTERM", 143, False),
    ("SIGTERM", None, False),
    (None, -15, False),
    ("NOT_A_SIGNAL", -15, False),
])
def test_default_action_death(sent: str | None, code: int | None, expected: bool) -> None:
    """Died of the graceful signal it was sent (exit == -signum), nothing else."""
    assert default_action_death(proc(signal=sent, exit_code=code)) is expected


def test_every_outcome_word_has_its_exit_code() -> None:
    """`drain` exits 0 only for graceful; each judged word has a code of its own."""
    assert set(exit_codes.OUTCOME_CODES) == set(outcome.OUTCOMES)
    assert exit_codes.OUTCOME_CODES["graceful"] == exit_codes.OK
    judged = [exit_codes.OUTCOME_CODES[word] for word in PRECEDENCE]
    assert len(set(judged)) == len(judged)
    assert exit_codes.OK not in judged
