"""The pure parts of watching a job: sentences, numbers, Prometheus text, the timeline story."""
import re

from hvdlite.driver.decisions.core import JobView
from hvdlite.driver.jobstats import JobStats, prometheus_text, status_line
from hvdlite.driver.sentences import sentence
from hvdlite.timeline import render, story


def test_events_read_as_sentences():
    assert sentence("worker_exit", {"slot": "host-a/2", "rank": 2, "code": -9}) == \
        "rank 2 on host-a (slot host-a/2) was killed by SIGKILL"
    assert sentence("round_complete", {"round": 3, "size": 2, "commit": 117, "reformed_in": 0.05,
                                       "cause": "failure"}) == \
        "world 3 formed: 2 workers go on from commit 117 (re-formed in 0.05 s after the failure)"
    assert sentence("hosts_changed", {"kind": "added", "added": ["b"], "removed": [],
                                      "hosts": ["a:2", "b:1"]}) == "hosts changed: added b; now a:2, b:1"
    assert sentence("something_new", {"x": 1}) == "something_new x=1"


def test_what_the_core_does_for_a_holder_a_template_or_a_stuck_member_is_said():
    assert sentence("worker_exit", {"slot": "h/1", "rank": 1, "code": -9, "cause": "its template died"}) == \
        "rank 1 on h (slot h/1) was killed by SIGKILL: its template died; starting it again"
    assert sentence("round_complete", {"round": 4, "size": 2, "commit": 9, "handover": True}) == \
        "world 4 formed: 2 workers sync from commit 9, then the holder on a sidelined slot leaves"
    assert sentence("worker_stuck", {"slot": "h/0", "rank": 0, "reason": "r"}) == \
        "rank 0 on h (slot h/0) never left its broken world (r); killing it"
    assert sentence("state_kept", {"slot": "h/0", "commit": 3, "reason": "r"}) == \
        "worker h/0 keeps commit 3 without training (r); waiting for hosts"


def view(size, commit, **kw):
    return JobView(**{"round": 1, "world_size": size, "target_size": 3, "commit": commit, "joining": 0,
                      "blacklisted_slots": 0, "resets": 0, **kw})


def test_steps_per_second_from_commits_and_a_rollback_restarts_it():
    stats = JobStats()
    for t in range(6):
        stats.on_view(view(2, 10 * t), 100.0 + t)
    assert stats.summary().steps_per_second == 10.0
    stats.on_view(view(1, 3), 106.0)  # every holder died: the newest commit went back
    assert stats.summary().steps_per_second == 0.0 and stats.summary().commits == 50


def test_prometheus_text_has_the_metrics_and_a_histogram():
    stats = JobStats()
    stats.on_event("worker_exit", {"code": -9}, 1.0)
    stats.on_event("worker_exit", {"code": -15, "removed": True}, 1.0)
    stats.on_event("round_complete", {"reformed_in": 0.07}, 2.0)
    stats.on_event("round_complete", {"reformed_in": 3.0}, 3.0)
    stats.on_view(view(2, 5, resets=2, blacklisted_slots=1), 3.0)
    text = prometheus_text(stats.summary())
    for line in ["hvdlite_world_size 2", "hvdlite_target_world_size 3", "hvdlite_resets_total 2",
                 "hvdlite_worker_failures_total 1", "hvdlite_commits_total 5", "hvdlite_blacklisted_slots 1",
                 'hvdlite_recovery_seconds_bucket{le="0.1"} 1', 'hvdlite_recovery_seconds_bucket{le="5"} 2',
                 'hvdlite_recovery_seconds_bucket{le="+Inf"} 2', "hvdlite_recovery_seconds_count 2",
                 "hvdlite_recovery_seconds_sum 3.07", "# TYPE hvdlite_steps_per_second gauge"]:
        assert line in text.splitlines(), line


def test_status_line_leaves_off_what_does_not_fit():
    stats = JobStats()
    stats.on_event("round_complete", {}, 10.0)
    stats.on_view(view(2, 5, joining=1), 10.0)
    assert status_line(stats.summary(), 14.0) == \
        "hvdlite: world 2/3 | 0.0 steps/s | commit 5 | 1 joining | 0 resets | last event 4 s ago"
    assert status_line(stats.summary(), 14.0, width=40) == "hvdlite: world 2/3 | 0.0 steps/s"


def test_story_of_a_kill_and_a_scale_up():
    records = [
        {"time": 0, "event": "worker_start", "slot": "h/0"}, {"time": 0, "event": "worker_start", "slot": "h/1"},
        {"time": 2, "event": "round_complete", "round": 1, "size": 2, "members": {"h/0": 0, "h/1": 1}},
        {"time": 5, "event": "worker_exit", "slot": "h/1", "rank": 1, "code": -9},
        {"time": 5, "event": "blacklisted", "key": "h/1", "cooldown": "permanent"},
        {"time": 5.1, "event": "round_complete", "round": 2, "size": 1, "members": {"h/0": 0},
         "reformed_in": 0.1, "cause": "failure"},
        {"time": 6, "event": "hosts_changed", "kind": "added", "added": ["h"], "removed": []},
        {"time": 6, "event": "worker_start", "slot": "h/2"},
        {"time": 8, "event": "round_complete", "round": 3, "size": 2, "members": {"h/0": 0, "h/2": 1},
         "reformed_in": 0.5, "cause": "hosts updated"},
        {"time": 9, "event": "job_end", "result": "success"}]
    s = story.build(records)
    assert s.slots == ["h/0", "h/1", "h/2"] and s.failures == 1 and s.result == "success"
    assert s.sizes == [(2, 2), (5.1, 1), (8, 2)]
    assert s.recoveries == [(5.0, 5.1, "failure"), (7.5, 8, "hosts updated")]
    assert [(g.start, g.end, g.state) for g in s.segments["h/1"]] == \
        [(0, 2, "joining"), (2, 5, "member"), (5, None, "blacklisted")]
    assert [m.label for m in s.marks if m.slot == "h/1" and m.kind == "failure"] == ["SIGKILL"]


def test_a_short_join_stays_visible_in_its_lane():
    """A 30 ms join in a 60 s job is a twentieth of a pixel wide: the lane still shows it,
    not covered by the membership that follows."""
    records = [
        {"time": 0, "event": "worker_start", "slot": "h/0"},
        {"time": 0.03, "event": "round_complete", "round": 1, "size": 1, "members": {"h/0": 0}},
        {"time": 60, "event": "job_end", "result": "success"}]
    page = render.html(story.build(records))
    rects = re.findall(r'<rect x="(\d+)" y="\d+" width="(\d+)" height="\d+" fill="([^"]+)"><title>(\w+) ', page)
    phases = {state: (int(x), int(w)) for x, w, _, state in rects}
    (join_x, join_w), (member_x, _) = phases["joining"], phases["member"]
    assert join_w >= render.MIN_PHASE_W and member_x >= join_x + join_w
