"""Planned work as a silence (files/dual_spark/silence.py) in a real Alertmanager, Debian's
(tests/observability.py) on loopback as the deploy runs it: made for as long as the mark counts,
extended with it, expired at its end, made anew where Alertmanager forgot it; none without a mark
in force; an Alertmanager that does not answer passed over with a message."""

import json
import time
import urllib.request

import pytest
from dual_spark import planned, silence

import programs
from tests.net import free_port
from tests.observability import alertmanager as running

CONFIG = "route: {receiver: none}\nreceivers: [{name: none}]\n"


@pytest.fixture
def alertmanager(tmp_path):
    """A real Alertmanager on loopback with no cluster listener; its URL."""
    (tmp_path / "alertmanager.yml").write_text(CONFIG)
    with running(tmp_path / "alertmanager.yml", tmp_path / "data") as url:
        yield url


def silences(url: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}/api/v2/silences", timeout=5) as answer:
        return json.load(answer)


def test_planned_work_silences_the_quiet_alerts_until_it_lapses_extended_with_it_and_expired_at_its_end(tmp_path, alertmanager):
    mark, now = tmp_path / "planned-work", time.time()
    planned.begin(mark, 600, "profile fast", now)
    identity = silence.begin(mark, alertmanager, now)
    [made] = silences(alertmanager)
    assert made["id"] == identity == silence.held(mark).read_text() and made["status"]["state"] == "active"
    assert made["matchers"] == [{"name": "planned_work", "value": "quiet", "isRegex": False, "isEqual": True}]
    assert made["comment"] == "planned work: profile fast" and made["createdBy"] == "dual-spark deploy"
    assert made["endsAt"].startswith(silence.stamp(now + 600)[:19])
    later = time.time()
    planned.begin(mark, 900, "rolled back", later)
    again = silence.begin(mark, alertmanager, later)
    active = [s for s in silences(alertmanager) if s["status"]["state"] == "active"]
    assert [s["id"] for s in active] == [again] == [silence.held(mark).read_text()]  # one silence, extended
    assert active[0]["endsAt"].startswith(silence.stamp(later + 900)[:19]) and active[0]["comment"] == "planned work: rolled back"
    silence.end(mark, alertmanager)
    assert {s["status"]["state"] for s in silences(alertmanager)} == {"expired"} and not silence.held(mark).exists()


def test_a_silence_alertmanager_forgot_is_made_anew(tmp_path, alertmanager):
    mark, now = tmp_path / "planned-work", time.time()
    planned.begin(mark, 600, "profile fast", now)
    silence.held(mark).write_text("0e9c5d9a-0000-4000-8000-000000000000")
    identity = silence.begin(mark, alertmanager, now)
    assert [s["id"] for s in silences(alertmanager)] == [identity] != ["0e9c5d9a-0000-4000-8000-000000000000"]


@pytest.mark.parametrize("mark", [None, "expired"])
def test_no_silence_without_a_mark_in_force(tmp_path, alertmanager, mark):
    path, now = tmp_path / "planned-work", time.time()
    if mark:
        planned.begin(path, 60, "profile fast", now - 120)
    assert silence.begin(path, alertmanager, now) is None and silences(alertmanager) == []


@pytest.mark.parametrize("text", ["../../-/reload", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", ""])
def test_a_held_id_that_is_no_id_is_never_put_in_a_path(tmp_path, alertmanager, text):
    """Not a UUID (a path, an API key's hex): passed over, and the file goes."""
    mark = tmp_path / "planned-work"
    silence.held(mark).write_text(text)
    assert silence.kept(silence.held(mark)) is None
    silence.end(mark, alertmanager)
    assert not silence.held(mark).exists()


def test_a_held_id_reached_through_a_link_is_not_read(tmp_path):
    """A link planted at the ID's name (to a file of the head's that holds an ID-shaped line) is not followed."""
    target, mark = tmp_path / "elsewhere", tmp_path / "planned-work"
    target.write_text("0e9c5d9a-0000-4000-8000-000000000000")
    silence.held(mark).symlink_to(target)
    assert silence.kept(target) == "0e9c5d9a-0000-4000-8000-000000000000" and silence.kept(silence.held(mark)) is None


def test_an_alertmanager_that_does_not_answer_is_said_and_passed_over(tmp_path, capsys):
    mark, gone = tmp_path / "planned-work", f"http://127.0.0.1:{free_port()}"
    planned.begin(mark, 60, "profile fast", time.time())
    assert silence.begin(mark, gone, time.time()) is None and not silence.held(mark).exists()
    assert f"Alertmanager at {gone} did not take POST /api/v2/silences" in capsys.readouterr().err
    assert planned.read(mark)["what"] == "profile fast"


def test_the_watchdog_runs_no_silence_so_a_change_to_it_restarts_no_vllm():
    """A stack's hash holds what the watchdog runs (programs.digest): the silences are apart from it."""
    assert "planned.py" in programs.runs("watchdog.py") and "silence.py" not in programs.runs("watchdog.py")
