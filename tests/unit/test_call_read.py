"""A read-only step whose connection dropped under it is asked again on a fresh connection
(Transport.call_read), once; a step that changes the host is never retried that way."""

import pytest

from provision.control.transport.base import Transport
from provision.errors import UnknownOutcome


class Flaky(Transport):
    def __init__(self, drops: int):
        super().__init__()
        self.drops, self.calls, self.opens = drops, 0, 0

    def open(self):
        self.opens += 1
        return self

    def call(self, request, **kw):
        self.calls += 1
        if self.drops:
            self.drops -= 1
            raise UnknownOutcome("h1: the connection dropped while the remote step ran")
        return {"ok": True, "op": request["op"]}


def test_a_dropped_read_is_asked_again_on_a_fresh_connection():
    t = Flaky(drops=1)
    assert t.call_read({"op": "status"}) == {"ok": True, "op": "status"}
    assert (t.calls, t.opens) == (2, 1)


def test_it_is_asked_once_more_only_and_never_after_ctrl_c():
    t = Flaky(drops=2)
    with pytest.raises(UnknownOutcome):
        t.call_read({"op": "status"})
    assert t.calls == 2
    t = Flaky(drops=1)
    t.cancel()
    with pytest.raises(UnknownOutcome):
        t.call_read({"op": "status"})
    assert t.calls == 1
