"""A multi-node server's ranks meeting at each step of its upgrade (tasks/upgrade_group.py): every
rank's post, a rank that ended first, a Ctrl-C, rank 0 alone. Pure: threads stand for the ranks."""

from __future__ import annotations

import threading
import time

from provision.config.inventory import Host
from provision.output.results import HostResult
from provision.tasks.upgrade_group import PREPARED, Rendezvous


def hosts():
    return [Host("n0", {"server": "k", "node_rank": 0}), Host("n1", {"server": "k", "node_rank": 1}),
            Host("solo", {})]


def test_every_rank_post_is_gathered_once_the_last_rank_posts():
    n0, n1, solo = hosts()
    g = Rendezvous([n0, n1, solo])
    got = {}

    def rank0():
        got["r0"] = g.gather(n0, PREPARED)

    t = threading.Thread(target=rank0)
    g.post(n0, PREPARED, "a")
    t.start()
    time.sleep(0.2)
    assert t.is_alive(), "rank 0 waits for rank 1"
    g.post(n1, PREPARED, "b")
    t.join(5)
    assert got["r0"] == ({0: "a", 1: "b"}, None)
    assert g.of(solo) is None and g.gather(solo, PREPARED) == ({}, None)  # not a rank: never waits
    assert g.head("k") is n0


def test_a_rank_that_ended_before_posting_ends_the_wait_with_its_words():
    n0, n1, _ = hosts()
    g = Rendezvous([n0, n1])
    g.post(n0, PREPARED, "a")
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r0", g.gather(n0, PREPARED)))
    t.start()
    g.host_done(n1, HostResult("n1", "failed", "/opt is writable by other accounts"))
    t.join(5)
    posted, why = out["r0"]
    assert posted == {0: "a"}
    assert why == "rank 1 of server k (n1) ended failed: /opt is writable by other accounts"


def test_a_rank_that_posted_and_then_ended_does_not_end_the_wait():
    n0, n1, _ = hosts()
    g = Rendezvous([n0, n1])
    g.post(n1, PREPARED, "b")
    g.host_done(n1, HostResult("n1", "refused", "later"))
    g.post(n0, PREPARED, "a")
    assert g.gather(n0, PREPARED) == ({0: "a", 1: "b"}, None)


def test_only_the_head_and_a_ctrl_c_and_a_timeout():
    n0, n1, _ = hosts()
    g = Rendezvous([n0, n1])
    g.post(n0, "before", {"tok_s": 1})
    assert g.gather(n1, "before", only_head=True) == ({0: {"tok_s": 1}}, None)  # rank 1 need not post
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    assert g.gather(n1, "decision", stop, only_head=True) == ({}, "interrupted")
    posted, why = g.gather(n1, "decision", timeout=0.1, only_head=True)
    assert posted == {} and "rank 0 (n0) of server k did not reach the decision step" in why


def test_each_restart_of_the_group_has_its_own_coordinator():
    n0, n1, _ = hosts()
    g = Rendezvous([n0, n1])
    new = g.multinode("k", "new")
    assert g.multinode("k", "new") is new and g.multinode("k", "old") is not new
    assert sorted(h.name for h in new.members["k"]) == ["n0", "n1"]
