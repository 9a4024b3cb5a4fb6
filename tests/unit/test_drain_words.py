"""What a stop's row says of the drain (tasks/server_verbs.drain_words), and the engines' own drain
lines it reads (inference `drain_remaining`, `drain_aborted`): pure (issue 59)."""

from __future__ import annotations

from provision.host import inference
from provision.tasks.server_verbs import drain_words

VLLM_ABORT_LOG = """\
(APIServer pid=41) INFO 12-06 20:01:02 [launcher.py:271] [shutdown] API server: stopping engine client mode=abort timeout=0s
(EngineCore_DP0 pid=77) INFO 12-06 20:01:02 [core.py:1636] [shutdown] EngineCore: start mode=abort timeout=0s
(EngineCore_DP0 pid=77) INFO 12-06 20:01:02 [core.py:1645] [shutdown] EngineCore: aborting in-flight requests count=2
"""


def test_vllm_says_how_many_requests_it_aborted_and_sglang_how_many_remain():
    vllm = inference.get("vllm")
    assert vllm.drain_aborted(VLLM_ABORT_LOG, None) == 2
    # the EngineCore force-killed before it could say: the running gauge read before the signal says
    api_only = VLLM_ABORT_LOG.splitlines()[0] + "\n"
    assert vllm.drain_aborted(api_only, 1) == 1 and vllm.drain_aborted(api_only, 0) is None
    assert vllm.drain_aborted("[shutdown] API server: stopping engine client mode=drain timeout=30s\n", 3) is None
    assert inference.get("sglang").drain_aborted(VLLM_ABORT_LOG, 2) is None
    text = ("Gracefully exiting... Remaining number of requests 3. Remaining requests remaining_rids=[...]\n"
            "Gracefully exiting... Remaining number of requests 1. Remaining requests remaining_rids=[...]\n")
    assert inference.get("sglang").drain_remaining(text) == 1


def test_the_rows_words_for_each_end_of_a_drain():
    assert drain_words({}, 30) == ""
    assert drain_words({"drain": {"drained": True, "waited": 2.5}}, 30) == \
        "; drained: every request in flight finished (2.5 s)"
    assert drain_words({"drain": {"drained": False, "waited": 30}, "cut": 3}, 30) == \
        "; 3 request(s) still in flight were cut at the 30 s deadline (--grace)"
    got = drain_words({"drain": {"drained": False, "waited": 0.4, "aborted": 2, "flag": "shutdown-timeout"},
                       "cut": 2}, 30)
    assert got.startswith("; 2 request(s) in flight were aborted by the server itself on SIGTERM, not drained "
                          "(it drains only when started with --shutdown-timeout above 0"), got
