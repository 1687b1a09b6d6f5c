"""Files the programs write whole (atomic.py): through a private file of an unpredictable name,
so a link planted at the names they used before (metrics' .NAME.PID.tmp, the sync records'
NAME.tmp) is left as it is, and so is what it points at."""

import os
import stat

import pytest
from dual_spark.atomic import write_atomically
from dual_spark.sync.model import read_json, write_json


def planted(tmp_path, *names: str):
    """Links at ``names`` to a file of another's: what a writer through them would overwrite."""
    victim = tmp_path / "victim"
    victim.write_text("theirs\n")
    for name in names:
        (tmp_path / name).symlink_to(victim)
    return victim


def test_the_metrics_textfile_is_written_beside_a_planted_link_not_through_it(tmp_path):
    victim = planted(tmp_path, f".spark.prom.{os.getpid()}.tmp")
    write_atomically(tmp_path / "spark.prom", "dual_spark_up 1\n")
    assert (tmp_path / "spark.prom").read_text() == "dual_spark_up 1\n"
    assert stat.S_IMODE((tmp_path / "spark.prom").stat().st_mode) == 0o644  # as before: the exporter reads it
    assert victim.read_text() == "theirs\n" and (tmp_path / f".spark.prom.{os.getpid()}.tmp").is_symlink()
    assert sorted(os.listdir(tmp_path)) == sorted([f".spark.prom.{os.getpid()}.tmp", "spark.prom", "victim"])


def test_a_sync_record_is_written_beside_a_planted_link_not_through_it(tmp_path):
    victim = planted(tmp_path, "verified.json.tmp")
    write_json(tmp_path / "verified.json", {"digest": "abc"})
    assert read_json(tmp_path / "verified.json") == {"digest": "abc"} and victim.read_text() == "theirs\n"
    assert sorted(os.listdir(tmp_path)) == ["verified.json", "verified.json.tmp", "victim"]


def test_a_write_that_fails_leaves_no_temporary_file_and_the_old_file_whole(tmp_path):
    (tmp_path / "state.json").write_text("{}")
    with pytest.raises(UnicodeEncodeError):
        write_atomically(tmp_path / "state.json", "\udc80")
    assert os.listdir(tmp_path) == ["state.json"] and (tmp_path / "state.json").read_text() == "{}"
