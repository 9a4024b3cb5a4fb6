"""One row renderer (output/report.host_line) for every command; reconcile's form is an option of
it, and its lines are what they were: a repair labelled "re-patched" ("would-re-patch" with --check),
no added methods (reconcile's detail says what it did), everything else as `patch` prints it."""

from __future__ import annotations

from hypothesis import given, strategies as st

from provision.output.report import host_line
from provision.output.results import HostResult
from provision.tasks import reconcile as rc


def reconcile_line_as_it_was(r: HostResult) -> str:
    """tasks/reconcile.host_line before it became an option of the shared renderer."""
    parts = [r.host, rc.label(r) if r.verdict in ("patched", "repaired") else r.verdict]
    if r.version:
        parts.append(f"sglang {r.version}")
    if r.data.get("spec"):
        parts.append(f"spec {r.data['spec']}")
    if r.file:
        parts.append(r.file)
    if r.detail:
        parts.append("- " + r.detail)
    return "  ".join(parts)


WIPED = HostResult("gpu01", "patched", detail="wiped: our block is gone: the file was replaced; re-patched",
                   version="0.5.9", file="/root/sglang/python/sglang/srt/models/kimi_k25.py",
                   added=["set_eagle3_layers_to_capture", "get_embed_and_head"], data={"spec": "kimi-k25-eagle3"})


def test_reconcile_labels_a_repair_and_leaves_out_the_added_methods():
    assert rc.host_line(WIPED) == ("gpu01  re-patched  sglang 0.5.9  spec kimi-k25-eagle3  "
                                   "/root/sglang/python/sglang/srt/models/kimi_k25.py  "
                                   "- wiped: our block is gone: the file was replaced; re-patched")
    checked = HostResult("gpu01", "repaired", version="0.5.9", data={"check": True})
    assert rc.host_line(checked) == "gpu01  would-re-patch  sglang 0.5.9"


def test_patch_prints_the_same_row_with_the_added_methods():
    assert host_line(WIPED) == ("gpu01  patched  sglang 0.5.9  spec kimi-k25-eagle3  "
                                "/root/sglang/python/sglang/srt/models/kimi_k25.py  "
                                "+set_eagle3_layers_to_capture, +get_embed_and_head  "
                                "- wiped: our block is gone: the file was replaced; re-patched")
    assert host_line(WIPED, check=True).startswith("gpu01  would-patch  sglang 0.5.9")


text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


@given(verdict=st.sampled_from(["patched", "repaired", "unchanged", "native", "wiped", "held", "failed", "unknown",
                                "staged", "removed", "foreign-edit", "blocked-git"]),
       detail=text, version=st.none() | text, file=st.none() | text, added=st.lists(text, max_size=3),
       spec=st.none() | text, check=st.booleans())
def test_reconcile_lines_are_byte_identical_to_before(verdict, detail, version, file, added, spec, check):
    r = HostResult("h", verdict, detail=detail, version=version, file=file, added=added,
                   data={"spec": spec, "check": check})
    assert rc.host_line(r) == reconcile_line_as_it_was(r)
