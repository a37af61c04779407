"""`hvdlite timeline EVENTS.jsonl -o timeline.html`: a picture of an elastic job from its event log."""
