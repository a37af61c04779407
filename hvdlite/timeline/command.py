"""`hvdlite timeline EVENTS.jsonl -o timeline.html`: read the event log, write the picture.
`hvdlite timeline FILE.parts [-o FILE]`: merge the per-rank parts of a --timeline-filename trace
that a killed driver left, into the Chrome trace the driver would have written."""
import os
import argparse
import json
import sys

from hvdlite.errors import HvdliteError, UsageError
from hvdlite.timeline import render, story
from hvdlite.worker import trace


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def build_parser():
    p = _Parser(prog="hvdlite timeline",
                description="Draw a job from its --event-log: world size over time, one lane per "
                            "slot, failures, host changes and each re-formation's duration; each run "
                            "appended to the log is drawn. Or merge FILE.parts, the per-rank parts "
                            "of a --timeline-filename trace a killed driver left, into FILE.",
                epilog="examples:\n  hvdlite timeline events.jsonl -o timeline.html\n"
                       "  hvdlite timeline trace.json.parts        # writes trace.json",
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("events", help="the JSON lines file `hvdlite run --event-log` wrote, or FILE.parts")
    p.add_argument("-o", "--output", help="HTML file to write (one self-contained page); for "
                                          "FILE.parts the trace to write (default FILE)")
    return p


def read_events(path) -> list:
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except OSError as e:
        raise HvdliteError(f"cannot read {path}: {e.strerror or e}") from None
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            if number == len(lines):
                break  # the last line of a log still being written
            raise HvdliteError(f"{path} line {number} is not JSON: is it an --event-log file?") from None
        if not isinstance(record, dict):
            raise HvdliteError(f"{path} line {number} is not an event: is it an --event-log file?")
        records.append(record)
    return records


def main(argv) -> int:
    try:
        args = build_parser().parse_args(argv)
        if os.path.isdir(args.events):
            return merge(args.events, args.output)
        if args.output is None:
            raise UsageError("name the page to write: -o timeline.html")
        if not args.output.endswith((".html", ".htm")):
            raise UsageError(f"-o {args.output}: only HTML is written (name it .html); open it in a "
                             f"browser to print or screenshot it")
        try:
            page = render.page(story.runs(read_events(args.events)))
        except ValueError as e:
            raise HvdliteError(f"{args.events}: {e}") from None
        try:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(page)
        except OSError as e:
            raise HvdliteError(f"cannot write {args.output}: {e.strerror or e}") from None
    except HvdliteError as e:  # input or output: 1; flags (UsageError): 2
        print(f"hvdlite timeline: error: {e}", file=sys.stderr)
        return e.exit_code
    print(f"hvdlite timeline: wrote {args.output}", file=sys.stderr)
    return 0


def merge(folder, output) -> int:
    """FILE.parts -> FILE (or `output`), the parts kept."""
    folder = folder.rstrip(os.sep)
    if not folder.endswith(trace.PARTS):
        raise UsageError(f"{folder} is a directory: give an --event-log file, or the FILE.parts "
                         f"folder of a --timeline-filename trace")
    trace_file = folder[:-len(trace.PARTS)]
    try:
        trace.merge_parts(trace_file, remove=False, out=output or trace_file)
    except (OSError, ValueError) as e:
        raise HvdliteError(f"cannot merge {folder}: {e}") from None
    print(f"hvdlite timeline: merged {folder} into {output or trace_file}", file=sys.stderr)
    return 0
