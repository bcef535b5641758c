"""``MigrationBook``'s bounds and expiry, as pure functions of what it was given (no server,
no sleeping: expiry takes its cutoff as an argument)."""

from __future__ import annotations

import pytest

from coordinator.errors import LimitReached
from coordinator.service.migrations import MigrationBook


def add(book: MigrationBook, *ids: str, at: float | None = None) -> None:
    book.check_room([(i, False) for i in ids])
    for request_id in ids:
        book.add("w", None, request_id, 1)
        if at is not None:
            book.pending[request_id].handed_back_at = at


def test_room_counts_only_new_pending_handoffs() -> None:
    book = MigrationBook(max_pending=3)
    add(book, "a", "b")
    book.check_room([("a", False), ("b", False), ("c", False)])  # a, b already pending
    book.check_room([("x", True), ("y", True), ("c", False)])  # engine-migrated: never pending
    with pytest.raises(LimitReached) as refused:
        book.check_room([("c", False), ("d", False)])
    assert refused.value.limit == "max_handoffs"
    assert "--max-handoffs" in str(refused.value)
    assert list(book.pending) == ["a", "b"]


def test_an_early_acked_handoff_needs_no_room() -> None:
    book = MigrationBook(max_pending=1)
    add(book, "a")
    assert book.ack(["b"]).early == ["b"]
    book.check_room([("b", False)])  # settled at once by its early ack
    assert book.add("w", None, "b", 1) == "acked"
    assert list(book.pending) == ["a"]


def test_early_acks_past_the_bound_change_nothing() -> None:
    book = MigrationBook(max_early=2)
    add(book, "p")
    assert book.ack(["e1", "p"]).early == ["e1"]
    with pytest.raises(LimitReached) as refused:
        book.ack(["e2", "e3"])
    assert refused.value.limit == "max_early_acks"
    assert list(book.early) == ["e1"]
    assert book.acked == 1
    result = book.ack(["e1", "e2"])  # e1 again is no new one
    assert (result.early, list(book.early)) == (["e1", "e2"], ["e1", "e2"])


def test_expiry_takes_only_what_is_older_than_the_cutoff() -> None:
    book = MigrationBook()
    add(book, "old1", at=10.0)
    add(book, "old2", at=20.0)
    add(book, "young", at=40.0)
    book.ack(["e-old"])
    book.early["e-old"] = 15.0
    book.ack(["e-young"])
    book.early["e-young"] = 50.0
    assert book.expire_before(30.0) == (2, 1)
    assert list(book.pending) == ["young"]
    assert list(book.early) == ["e-young"]
    assert book.counts() == {"handed_back": 3, "acked": 0, "expired": 2, "pending": 1,
                             "early_acks": 1}
    # An expired one acknowledged late is known as settled, not taken for an early one.
    assert book.ack(["old1"]).unknown == ["old1"]
    assert book.expire_before(30.0) == (0, 0)
