"""`hvdlite timeline EVENTS.jsonl -o timeline.html`: read the event log, write the picture."""
import argparse
import json
import sys

from hvdlite.errors import UsageError
from hvdlite.timeline import render, story


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def build_parser():
    p = _Parser(prog="hvdlite timeline",
                description="Draw an elastic job from its --event-log: world size over time, one "
                            "lane per slot, failures, host changes and each re-formation's duration.")
    p.add_argument("events", help="the JSON lines file `hvdlite run --event-log` wrote")
    p.add_argument("-o", "--output", required=True, help="HTML file to write (one self-contained page)")
    return p


def read_events(path) -> list:
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from None
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            if number == len(lines):
                break  # the last line of a log still being written
            raise UsageError(f"{path} line {number} is not JSON: is it an --event-log file?") from None
        if not isinstance(record, dict):
            raise UsageError(f"{path} line {number} is not an event: is it an --event-log file?")
        records.append(record)
    return records


def main(argv) -> int:
    try:
        args = build_parser().parse_args(argv)
        if not args.output.endswith((".html", ".htm")):
            raise UsageError(f"-o {args.output}: only HTML is written (name it .html); open it in a "
                             f"browser to print or screenshot it")
        try:
            page = render.html(story.build(read_events(args.events)))
        except ValueError as e:
            raise UsageError(f"{args.events}: {e}") from None
        try:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(page)
        except OSError as e:
            raise UsageError(f"cannot write {args.output}: {e.strerror or e}") from None
    except UsageError as e:
        print(f"hvdlite timeline: error: {e}", file=sys.stderr)
        return e.exit_code
    print(f"hvdlite timeline: wrote {args.output}", file=sys.stderr)
    return 0
