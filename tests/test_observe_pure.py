"""The pure parts of watching a job: sentences, numbers, Prometheus text, the timeline story."""
import ast
import glob
import os
import re

import hvdlite.driver
from hvdlite.driver.decisions.core import JobView
from hvdlite.driver.jobstats import JobStats, prometheus_text, status_line
from hvdlite.driver.sentences import SENTENCES, sentence
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


def logged_event_kinds():
    """Every event kind the driver's code can log, found in its source: the first argument of
    each _log/emit/announce call, the event of each _kill, and the events the pure rules
    return in tuples (workers._limits, Stragglers.check)."""
    kinds = set()
    for path in glob.glob(os.path.join(os.path.dirname(hvdlite.driver.__file__), "**", "*.py"), recursive=True):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                place = {"_log": 0, "emit": 0, "announce": 0, "_kill": 1}.get(node.func.attr)
                if place is not None and len(node.args) > place and isinstance(node.args[place], ast.Constant):
                    kinds.add(node.args[place].value)
            if isinstance(node, ast.FunctionDef) and node.name in ("_limits", "check"):
                for t in ast.walk(node):
                    if isinstance(t, ast.Tuple):
                        kinds |= {e.value for e in t.elts if isinstance(e, ast.Constant) and
                                  isinstance(e.value, str) and re.fullmatch(r"[a-z]+(_[a-z]+)+|straggler", e.value)}
    return kinds - {None}


def test_every_event_the_driver_can_log_has_a_sentence():
    # The console shows sentence(); a kind without one would show as raw `event key=value`.
    kinds = logged_event_kinds()
    for known in ("node_probe", "node_probed", "launch_overdue", "retry_later", "worker_unresponsive",
                  "worker_start_timeout", "straggler", "straggler_recovered", "discovery_empty"):
        assert known in kinds, known  # the scan finds the kinds logged in every way
    assert sorted(kinds - SENTENCES.keys()) == []


def test_the_events_of_a_probe_a_late_launch_and_a_retry_read_as_sentences():
    who = {"slot": "h/1", "rank": 1, "worker": "h/1#2"}
    assert sentence("node_probe", {**who, "reason": "heartbeat late"}) == \
        "rank 1 on h (slot h/1) is silent (heartbeat late); probing its node"
    assert sentence("node_probed", {**who, "outcome": "listening"}).startswith(
        "rank 1 on h (slot h/1)'s node answered the probe: its process is there")
    assert sentence("node_probed", {**who, "outcome": "silent"}) == \
        "rank 1 on h (slot h/1): its node did not answer a probe"
    assert sentence("worker_exit", {**who, "code": -9, "node": "refused"}) == \
        "rank 1 on h (slot h/1) is taken as failed: its node answered but its process is gone"
    assert sentence("launch_overdue", {"slot": "h/1", "worker": "h/1#2", "after": 30.0}) == \
        "worker h/1 gave no process within --start-timeout 30 s of its launch; launching it again later"
    assert sentence("retry_later", {"slot": "h/1", "whose": "driver", "after": "2.0s"}) == \
        "worker h/1 is launched again in 2.0s (the driver's trouble, not its host's: nothing is blacklisted)"
    assert sentence("discovery_empty", {"min_np": 2}) == \
        "host discovery lists no hosts: no worker can start until it lists at least --min-np 2 slots"


def test_sentences_count_right():
    assert sentence("round_complete", {"round": 4, "size": 1, "commit": 9}) == \
        "world 4 formed: 1 worker goes on from commit 9"
    assert sentence("round_complete", {"round": 1, "size": 1}) == "world 1 formed: 1 worker starts training"
    assert sentence("round_complete", {"round": 1, "size": 2}) == "world 1 formed: 2 workers start training"
    assert sentence("hosts_changed", {"kind": "mixed", "added": ["a", "c"], "removed": [],
                                      "resized": {"a": [2, 3]}, "hosts": ["a:3", "c:1"]}) == \
        "hosts changed: a 2 -> 3 slots; added c; now a:3, c:1"
    # -np does not say how many workers an elastic job starts (its hosts' slots do): not named.
    assert sentence("job_start", {"mode": "elastic", "np": 8, "min_np": 1, "max_np": 8}) == \
        "starting an elastic job: one worker per slot of the hosts found, at least 1, at most 8"
    assert sentence("job_start", {"mode": "elastic", "np": 2, "min_np": 1, "max_np": None}) == \
        "starting an elastic job: one worker per slot of the hosts found, at least 1"
    assert sentence("job_start", {"mode": "static", "np": 1}) == "starting a static job of 1 worker"
    assert sentence("discovery_recovered", {"failures": 1}) == "host discovery works again, after 1 failed run"
    assert sentence("launch_token_reused", {"worker": "n1/0#1", "first": "10.0.0.9", "sender": "10.0.0.11"}) == (
        "refused a second use of worker n1/0#1's one-time launch token, from 10.0.0.11; the first use, which "
        "got the job's secret, came from 10.0.0.9: if that is not the worker's host, whoever read its launch "
        "holds the job's secret")
    assert sentence("job_end", {"result": "success", "resets": 1, "failed": ["rank 1 on a exited with code 1"]}) \
        == "job finished after 1 reset; 1 worker failed on the way: rank 1 on a exited with code 1"


def test_what_the_core_does_for_a_holder_a_template_or_a_stuck_member_is_said():
    assert sentence("worker_exit", {"slot": "h/1", "rank": 1, "code": -9, "cause": "its template died"}) == \
        "rank 1 on h (slot h/1) was killed by SIGKILL: its template died; starting it again"
    assert sentence("round_complete", {"round": 4, "size": 2, "commit": 9, "handover": True}) == \
        "world 4 formed: 2 workers sync from commit 9, then the holder on a sidelined slot leaves"
    assert sentence("member_left_behind", {"slot": "h/3", "rank": 3, "round": 7, "after": 5.012}) == \
        "rank 3 on h (slot h/3) is still in world 7 after 5 s; world 8 forms without it (it joins when it is back)"
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
                 "hvdlite_worker_failures_total 1", "hvdlite_newest_commit 5", "hvdlite_blacklisted_slots 1",
                 'hvdlite_recovery_seconds_bucket{le="0.1"} 1', 'hvdlite_recovery_seconds_bucket{le="5"} 2',
                 'hvdlite_recovery_seconds_bucket{le="+Inf"} 2', "hvdlite_recovery_seconds_count 2",
                 "hvdlite_recovery_seconds_sum 3.07", "# TYPE hvdlite_steps_per_second gauge",
                 "# TYPE hvdlite_newest_commit gauge"]:
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
        {"time": 7.5, "event": "round_broken", "round": 2, "cause": "hosts updated"},
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
    assert [m.label for m in s.marks if m.kind == "broken"] == ["world 2 re-forms for hosts"]


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


def test_a_static_job_is_one_world_of_every_rank():
    records = [
        {"time": 0, "event": "job_start", "mode": "static", "np": 2},
        {"time": 0.1, "event": "worker_start", "slot": "h/0", "rank": 0},
        {"time": 0.1, "event": "worker_start", "slot": "h/1", "rank": 1},
        {"time": 5, "event": "worker_exit", "slot": "h/1", "rank": 1, "code": 1},
        {"time": 5.2, "event": "worker_exit", "slot": "h/0", "rank": 0, "code": -15},
        {"time": 5.3, "event": "job_end", "result": "failure"}]
    for log in (records, records[1:]):  # with job_start, and as logs written before it were
        s = story.build(log)
        assert s.mode == "static" and s.worlds == 1 and s.failures == 2
        assert [(g.state, g.label) for g in s.segments["h/1"]] == [("member", "rank 1")]
        assert s.sizes == [(0.1, 1), (0.1, 2), (5, 1), (5.2, 0)]
    assert render.summary(story.build(records)).startswith(
        "hvdlite timeline: static job, 2 slots, 1 world, 2 failures, 0 re-formations")
    assert "1 failure," in render.summary(story.build(records[:4]))


def test_runs_appended_to_one_log_are_drawn_each_and_the_resume_marked():
    killed = [{"time": 0, "event": "job_start", "mode": "elastic", "np": 1},
              {"time": 0, "event": "worker_start", "slot": "h/0"},
              {"time": 1, "event": "round_complete", "round": 1, "size": 1, "members": {"h/0": 0}}]
    resumed = [{**r, "time": r["time"] + 100} for r in killed] + [
        {"time": 105, "event": "worker_exit", "slot": "h/0", "rank": 0, "code": 0},
        {"time": 105, "event": "job_end", "result": "success"}]
    older = [{k: v for k, v in r.items()} for r in resumed if r["event"] != "job_start"]  # no job_start
    for log in (killed + resumed, resumed[1:] + older):
        runs = story.runs(log)
        assert len(runs) == 2 and [r.run for r in runs] == [1, 2]
    runs = story.runs(killed + resumed)
    assert runs[0].result == "" and runs[1].result == "success" and runs[0].end == 1
    page = render.page(runs)
    assert page.count("<svg") == 2 and "resume (run 2)" in page
    assert "run 1 of 2: elastic job, 1 slot, 1 world, 0 failures" in page
    assert "no end recorded (was the driver killed?)" in page


def test_reformation_labels_do_not_overlap():
    records = [{"time": 0, "event": "worker_start", "slot": "h/0"},
               {"time": 0, "event": "worker_start", "slot": "h/1"}]
    for k in range(6):  # re-formations 0.2 s apart in a 60 s job: a few pixels apart
        records.append({"time": 10 + 0.2 * k, "event": "round_complete", "round": k + 1, "size": 2,
                        "members": {"h/0": 0, "h/1": 1}, "reformed_in": 0.05, "cause": "failure"})
        records.append({"time": 10 + 0.2 * k, "event": "hosts_changed", "kind": "added",
                        "added": [f"host-{k}"], "removed": []})
    records.append({"time": 60, "event": "job_end", "result": "success"})
    page = render.html(story.build(records))
    labels = [(float(x), float(y), text) for x, y, text in
              re.findall(r'<text class="small" x="([\d.]+)" y="([\d.]+)"[^>]*>([^<]*(?: s|host-\d))</text>', page)]
    assert len(labels) >= 2 * render.LABEL_ROWS
    for i, (x1, y1, t1) in enumerate(sorted(labels)):
        for x2, y2, t2 in sorted(labels)[i + 1:]:
            if y1 == y2:  # the later one starts where the earlier one's text ends
                assert x2 >= x1 + render.CHAR_W * len(t1), (t1, t2)
