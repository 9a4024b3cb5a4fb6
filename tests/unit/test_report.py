"""How rows, tables and summaries say a run's verdicts (output/report.py). Pure."""

from __future__ import annotations


def test_a_check_says_would_in_the_line_the_table_and_the_summary_alike():
    """issue 63: `patch --check`'s row said would-patch and its summary "1 patched"."""
    from provision.output import report
    from provision.output.results import HostResult

    rows = [HostResult("a", "patched"), HostResult("b", "unchanged"), HostResult("c", "patched")]
    assert report.summary_line(rows, check=True) == "3 hosts: 2 would-patch, 1 unchanged"
    assert report.summary_line(rows) == "3 hosts: 2 patched, 1 unchanged"
    assert [r[1] for r in report.host_rows(rows, ["host", "verdict"], check=True)] == \
        ["would-patch", "unchanged", "would-patch"]
    assert report.host_line(rows[0], check=True).startswith("a  would-patch")


def test_a_vllm_install_is_named_vllm_in_the_line():
    """issue 63: status called a vLLM install "sglang 0.32.0" (its rows carry the engine)."""
    from provision.output import report
    from provision.output.results import HostResult

    r = HostResult("v", "native", "x", version="0.32.0", data={"engine": "vllm"})
    assert "  vllm 0.32.0  " in report.host_line(r)
    assert "  sglang 0.5.9  " in report.host_line(HostResult("s", "patched", "x", version="0.5.9"))
