"""The mark of planned work (files/dual_spark/planned.py) on real files: written whole, kept from
its start while extended, new once expired, and only a mark as written is read as one."""

import json
import os

import pytest
from dual_spark import planned


def test_a_mark_begins_keeps_its_start_while_in_force_and_starts_anew_once_expired(tmp_path):
    path = tmp_path / "planned-work"
    assert planned.begin(path, 600, "profile fast", now=1000.0) == {"since": 1000.0, "until": 1600.0, "what": "profile fast"}
    assert planned.begin(path, 600, "rolled back", now=1300.0) == {"since": 1000.0, "until": 1900.0, "what": "rolled back"}
    assert planned.begin(path, 60, "profile adaptive", now=5000.0)["since"] == 5000.0  # the one before had expired
    assert planned.reading(path, 5030.0) == {"since": 5000.0, "until": 5060.0, "what": "profile adaptive", "age_seconds": 30,
                                             "in_force": True}
    assert planned.reading(path, 5060.0)["in_force"] is False
    planned.end(path)
    planned.end(path)  # twice: nothing to remove
    assert planned.reading(path, 5030.0) is None


def test_a_mark_is_written_through_no_link(tmp_path):
    """A link planted at the mark's name is replaced, never written through."""
    target, path = tmp_path / "elsewhere", tmp_path / "planned-work"
    target.write_text("theirs")
    os.symlink(target, path)
    planned.begin(path, 60, "profile fast", now=0.0)
    assert target.read_text() == "theirs" and not path.is_symlink()


@pytest.mark.parametrize("text", ["", "{", "[]", '{"since": 1, "until": 2}', '{"since": "1", "until": 2, "what": "x"}',
                                  '{"since": true, "until": 2, "what": "x"}', '{"since": 1, "until": NaN, "what": "x"}'])
def test_what_is_not_a_mark_is_none(text):
    assert planned.parsed(text) is None


def test_a_mark_as_written_reads_back():
    assert planned.parsed(json.dumps({"since": 1, "until": 2.5, "what": "x"})) == {"since": 1.0, "until": 2.5, "what": "x"}
