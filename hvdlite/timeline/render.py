"""A Story as one self-contained HTML page: inline SVG and CSS, no script, nothing fetched."""
from html import escape

from hvdlite.timeline.story import Story

WIDTH = 1200
LEFT = 170  # lane labels
RIGHT = 60
TOP = 40  # title
SIZE_H = 120  # world size chart
LANE_H = 24
MIN_PHASE_W = 3  # pixels: the narrowest a lane shows a phase
LANE_GAP = 6
LABEL_ROWS = 3  # rows for labels that would overlap (re-formation times, host changes)
ROW_H = 11
CHAR_W = 6  # pixels per character of a small label, about
AXIS_H = 30 + (LABEL_ROWS - 1) * ROW_H
COLOURS = {"joining": "#f2a93b", "member": "#2f9e44", "blacklisted": "#495057", "straggler": "#d6336c",
           "failure": "#e03131", "exit": "#1c7ed6", "hosts": "#7048e8", "broken": "#adb5bd",
           "recovery": "#ffe3e3", "size": "#1c7ed6", "resume": "#7048e8"}
OVERLAYS = {"blacklisted": LANE_H - 6, "straggler": 0}  # strips over a lane: their top, in it

STYLE = """
body { font: 13px sans-serif; margin: 0; padding: 0; color: #212529; background: #fff; }
svg text { font: 11px sans-serif; fill: #212529; }
svg .lane-label { font: 12px monospace; }
svg .small { font-size: 10px; }
svg { display: block; }
.legend { margin: 8px; }
.legend span { display: inline-block; margin-right: 14px; }
.legend i { display: inline-block; width: 14px; height: 10px; margin-right: 4px; vertical-align: middle; }
"""


def lane_top(index: int) -> int:
    """Top edge of lane `index`, in page pixels inside the SVG."""
    return TOP + SIZE_H + AXIS_H + index * (LANE_H + LANE_GAP)


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def summary(story: Story, runs: int = 1) -> str:
    run = f"run {story.run} of {runs}: " if runs > 1 else ""
    mode = f"{story.mode} job, " if story.mode else ""
    result = story.result or "no end recorded (was the driver killed?)"
    return (f"hvdlite timeline: {run}{mode}{_count(len(story.slots), 'slot')}, "
            f"{_count(story.worlds, 'world')}, {_count(story.failures, 'failure')}, "
            f"{_count(len(story.recoveries), 're-formation')}, {story.end - story.start:.1f} s, {result}")


def place_labels(labels, left: int = LEFT, right: int = WIDTH):
    """Rows for labels [(x, text)] so that none covers another: each takes the first of
    LABEL_ROWS rows where it fits, else None (its shape's tooltip still tells)."""
    ends = [left - 1e9] * LABEL_ROWS  # right edge of the last label in each row
    rows = []
    for x, text in labels:
        width = len(text) * CHAR_W
        x = min(x, right - width)
        row = next((i for i, end in enumerate(ends) if x >= end + 4), None)
        if row is not None:
            ends[row] = x + width
        rows.append((x, row))
    return rows


def page(stories) -> str:
    """Every run of an event log, one under the other; the later ones are marked as resumes."""
    title = summary(stories[0]) if len(stories) == 1 else \
        f"hvdlite timeline: {_count(len(stories), 'run')} of one event log"
    legend = "".join(f'<span><i style="background:{COLOURS[k]}"></i>{label}</span>' for k, label in [
        ("joining", "starting / joining"), ("member", "member of a world (rank)"),
        ("blacklisted", "blacklisted"), ("straggler", "straggler"), ("failure", "failed (exit code / signal)"),
        ("exit", "exited"), ("hosts", "host change"), ("recovery", "re-formation (duration)"),
        ("resume", "run started again on the same log (a resume)")])
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>"
            + "\n".join(svg(story, len(stories)) for story in stories)
            + f'\n<div class="legend">{legend}</div>\n</body></html>\n')


def html(story: Story) -> str:
    """The page of one run."""
    return page([story])


def svg(story: Story, runs: int = 1) -> str:
    span = max(story.end - story.start, 1e-3)
    plot_w = WIDTH - LEFT - RIGHT

    def x(t):
        return LEFT + (min(max(t, story.start), story.end) - story.start) / span * plot_w

    height = lane_top(len(story.slots)) + 20
    top_size = max([s for _, s in story.sizes] + [1])
    size_y0 = TOP + SIZE_H - 10  # y of world size 0

    def size_y(n):
        return size_y0 - n / top_size * (SIZE_H - 30)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'viewBox="0 0 {WIDTH} {height}">',
           f'<text x="{LEFT}" y="20" style="font-size:14px">{escape(summary(story, runs))}</text>']
    if story.run > 1:  # the same job started again on this log: a resume (from its checkpoints)
        out.append(f'<rect x="{LEFT - 4}" y="{TOP}" width="4" height="{height - TOP}" '
                   f'fill="{COLOURS["resume"]}"><title>run {story.run}: started again</title></rect>'
                   f'<text x="8" y="20" style="font-size:14px;fill:{COLOURS["resume"]}">'
                   f'resume (run {story.run})</text>')
    # recoveries: shaded across the whole page, with their duration
    texts = [f"{end - start:.2f} s" for start, end, _ in story.recoveries]
    places = place_labels([(x(end) + 2, text) for (_, end, _), text in zip(story.recoveries, texts)])
    for (start, end, cause), text, (lx, row) in zip(story.recoveries, texts, places):
        w = max(x(end) - x(start), 1.5)
        out.append(f'<rect x="{x(start):.1f}" y="{TOP}" width="{w:.1f}" height="{height - TOP}" '
                   f'fill="{COLOURS["recovery"]}"><title>re-formed in {end - start:.3f} s '
                   f'({escape(cause)})</title></rect>')
        if row is not None:
            out.append(f'<text class="small" x="{lx:.1f}" y="{TOP + 12 + row * ROW_H}">{text}</text>')
    # world size over time
    out.append(f'<text x="8" y="{TOP + 14}">world size</text>')
    for n in range(0, top_size + 1, max(1, top_size // 4)):
        out.append(f'<text class="small" x="{LEFT - 16}" y="{size_y(n) + 3:.1f}">{n}</text>'
                   f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{size_y(n):.1f}" y2="{size_y(n):.1f}" '
                   f'stroke="#e9ecef"/>')
    if story.sizes:
        points, last = [], 0
        for t, n in story.sizes:
            points += [f"{x(t):.1f},{size_y(last):.1f}", f"{x(t):.1f},{size_y(n):.1f}"]
            last = n
        points.append(f"{x(story.end):.1f},{size_y(last):.1f}")
        out.append(f'<polyline points="{" ".join(points)}" fill="none" stroke="{COLOURS["size"]}" '
                   f'stroke-width="2"/>')
    # time axis
    axis_y = TOP + SIZE_H + 12
    step = _tick(span)
    t = 0.0
    while t <= span + 1e-9:
        out.append(f'<line x1="{x(story.start + t):.1f}" x2="{x(story.start + t):.1f}" y1="{TOP + 20}" '
                   f'y2="{height - 10}" stroke="#f1f3f5"/>'
                   f'<text class="small" x="{x(story.start + t):.1f}" y="{axis_y}">{t:g} s</text>')
        t += step
    # job-wide marks: host changes, broken worlds
    job_marks = [m for m in story.marks if m.slot is None]
    hosts = [m for m in job_marks if m.kind == "hosts"]
    rows = dict(zip(map(id, hosts), place_labels([(x(m.time) + 3, f"hosts {m.label}") for m in hosts])))
    for m in job_marks:
        colour = COLOURS[m.kind]
        dash = ' stroke-dasharray="4 3"' if m.kind == "hosts" else ""
        out.append(f'<line x1="{x(m.time):.1f}" x2="{x(m.time):.1f}" y1="{TOP + 20}" y2="{height - 10}" '
                   f'stroke="{colour}"{dash}><title>{escape(m.label)}</title></line>')
        lx, row = rows.get(id(m), (0, None))
        if row is not None:
            out.append(f'<text class="small" x="{lx:.1f}" y="{TOP + SIZE_H + 24 + row * ROW_H}" '
                       f'style="fill:{colour}">hosts {escape(m.label)}</text>')
    # one lane per slot
    for i, slot in enumerate(story.slots):
        y = lane_top(i)
        out.append(f'<text class="lane-label" x="8" y="{y + LANE_H - 8}">{escape(slot)}</text>'
                   f'<rect x="{LEFT}" y="{y}" width="{plot_w}" height="{LANE_H}" fill="#f8f9fa"/>')
        cursor = 0  # where the lane's previous phase ended, in whole pixels
        for seg in sorted(story.segments[slot], key=lambda s: (s.state in OVERLAYS, s.start)):
            end = story.end if seg.end is None else seg.end
            if seg.state in OVERLAYS:  # a strip over the lane's phases
                w = max(x(end) - x(seg.start), 1.0)
                out.append(f'<rect x="{x(seg.start):.1f}" y="{y + OVERLAYS[seg.state]}" width="{w:.1f}" '
                           f'height="6" fill="{COLOURS[seg.state]}"><title>{seg.state} '
                           f'({escape(seg.label)})</title></rect>')
                continue
            # Whole pixels, and every phase at least MIN_PHASE_W wide and not covered by the
            # next: a 30 ms join in a minute-long job would otherwise vanish.
            left = max(round(x(seg.start)), cursor)
            cursor = max(round(x(end)), left + MIN_PHASE_W)
            w = cursor - left
            out.append(f'<rect x="{left}" y="{y + 2}" width="{w}" height="{LANE_H - 10}" '
                       f'fill="{COLOURS[seg.state]}"><title>{seg.state} {escape(seg.label)}</title></rect>')
            if seg.label and w > 40:
                out.append(f'<text class="small" x="{left + 3}" y="{y + 13}" '
                           f'style="fill:#fff">{escape(seg.label)}</text>')
        for m in story.marks:
            if m.slot == slot and m.kind in ("exit", "failure"):
                mx = x(m.time)
                out.append(f'<path d="M{mx - 5:.1f},{y + 2} L{mx + 5:.1f},{y + LANE_H - 6} '
                           f'M{mx + 5:.1f},{y + 2} L{mx - 5:.1f},{y + LANE_H - 6}" '
                           f'stroke="{COLOURS[m.kind]}" stroke-width="2.5"/>'
                           f'<text class="small" x="{mx + 7:.1f}" y="{y + 13}" '
                           f'style="fill:{COLOURS[m.kind]}">{escape(m.label)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _tick(span: float) -> float:
    """A round step that puts 5-12 ticks on the axis."""
    for step in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600):
        if span / step <= 12:
            return step
    return span / 10
