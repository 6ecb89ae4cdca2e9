"""Report files are replaced whole: a failure while writing one leaves the previous file."""

import os

import pytest

from kernelforge.report.write import write_text


def test_a_failed_write_leaves_the_previous_report_whole(tmp_path, monkeypatch):
    report = tmp_path / "REPORT.md"
    write_text(report, "the previous report\n")
    assert report.read_text() == "the previous report\n"

    def full_disk(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError):
        write_text(report, "a new report that never arrives whole\n")
    assert report.read_text() == "the previous report\n"
    assert [p.name for p in tmp_path.iterdir()] == ["REPORT.md"], "no partial file left behind"
