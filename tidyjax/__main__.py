"""``python -m tidyjax view FILE.json [-o FILE.html]``: draw a dumped Timeline or Snapshot.

Exit status 0 when the page was written, 2 when the file cannot be read as either (the message
names the file and what was wrong).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from ._errors import TidyjaxError
from ._snapshot import Snapshot
from ._timeline import Timeline
from ._timeline_format import FORMAT as TIMELINE_FORMAT


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tidyjax",
        description="tidyjax command-line tools.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    view = commands.add_parser(
        "view",
        help="turn a dumped Timeline or Snapshot (JSON) into a self-contained HTML page",
        description="Turn a file written by Timeline.dump(path) or tidyjax.snapshot().dump(path) "
        "into one self-contained HTML page (no network needed to open it).",
    )
    view.add_argument("file", metavar="FILE.json", help="the dumped timeline or snapshot")
    view.add_argument(
        "-o",
        "--output",
        metavar="FILE.html",
        help="where to write the page (default: FILE.json with the suffix .html)",
    )
    return parser


def _read(path: str) -> Timeline:
    """The timeline in ``path`` (a snapshot becomes a timeline of one moment)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise TidyjaxError(f"{path}: cannot read it ({e.strerror or e}).") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TidyjaxError(f"{path}: not a JSON file ({e}).") from e
    kind = data.get("format") if isinstance(data, dict) else None
    if kind == "tidyjax.snapshot":
        try:
            return Timeline.from_snapshot(Snapshot.load(path))
        except TidyjaxError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            raise TidyjaxError(f"{path}: a malformed tidyjax snapshot ({e!r}).") from e
    if kind == TIMELINE_FORMAT:
        return Timeline.from_json(data, where=path)
    raise TidyjaxError(
        f'{path}: not a tidyjax timeline or snapshot (its "format" is {kind!r}); write one '
        "with Timeline.dump(path) or tidyjax.snapshot().dump(path)."
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    if args.command == "view":
        try:
            tl = _read(args.file)
        except TidyjaxError as e:
            print(f"tidyjax view: {e}", file=sys.stderr)
            return 2
        out = args.output or os.path.splitext(args.file)[0] + ".html"
        try:
            tl.save_html(out)
        except OSError as e:
            print(f"tidyjax view: {out}: cannot write the page ({e.strerror or e}).",
                  file=sys.stderr)  # fmt: skip
            return 2
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
