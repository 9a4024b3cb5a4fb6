"""restore_refusal: which backups `provision restore` may put back (pure)."""

from __future__ import annotations

from provision.host.ops.restore import restore_refusal

ORIGINAL = {"id": "abc123def456", "original": True, "time": "2026-11-30T10:00:00+0000", "sglang_version": "0.5.9"}
LEFT = {"sha": "a" * 64, "what": "the last patch (2026-11-30T10:00:01+0000)"}


def test_same_release_and_the_file_as_we_left_it_is_allowed():
    assert restore_refusal(ORIGINAL, "0.5.9", "a" * 64, LEFT) is None


def test_another_release_is_refused_naming_both_versions():
    why = restore_refusal(ORIGINAL, "0.5.10", "a" * 64, LEFT)
    assert why.startswith("refusing to restore: backup abc123def456 (the original) was taken under SGLang 0.5.9, "
                          "but SGLang 0.5.10 is installed now: it would put 0.5.9's file into 0.5.10")
    assert why.endswith("or pass --force to restore anyway")


def test_a_file_changed_since_we_left_it_is_refused():
    why = restore_refusal(ORIGINAL, "0.5.9", "b" * 64, LEFT)
    assert "not as provision last left it (sha256 bbbbbbbbbbbb now, aaaaaaaaaaaa after the last patch" in why


def test_both_reasons_and_unknowns_are_refused():
    why = restore_refusal(ORIGINAL, "0.5.10", "b" * 64, LEFT)
    assert "0.5.9" in why and "0.5.10" in why and "not as provision last left it" in why
    assert "version not recorded" in restore_refusal(dict(ORIGINAL, sglang_version=None), "0.5.9", "a" * 64, LEFT)
    assert "version unknown" in restore_refusal(ORIGINAL, None, "a" * 64, LEFT)
    assert "no record of how it last left" in restore_refusal(ORIGINAL, "0.5.9", "a" * 64, None)
