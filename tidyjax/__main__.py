"""``python -m tidyjax view FILE.json [-o FILE.html] [--open] [--chrome-trace FILE]``: draw a
dumped Timeline or Snapshot.

Writes the page (creating missing folders) and prints its ``file://`` URL, or opens it in the
default browser with ``--open`` (the standard library's ``webbrowser``). ``--chrome-trace``
also writes the timeline as Chrome trace-event JSON for Perfetto's UI. Exit status 0 when the
page was written, 2 when the file cannot be read or a file cannot be written (one line naming
the file and what was wrong, no traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import webbrowser
from collections.abc import Callable, Sequence
from typing import Any

from ._errors import TidyjaxError
from ._oom import oom_page
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
        help="where to write the page (default: FILE.json with the suffix .html); missing "
        "folders are created, and a folder gets FILE.html inside it",
    )
    view.add_argument(
        "--open",
        action="store_true",
        help="open the page in the default web browser (else its file:// URL is printed)",
    )
    view.add_argument(
        "--chrome-trace",
        metavar="TRACE.json",
        help="also write the timeline as Chrome trace-event JSON (gzipped if it ends in .gz), "
        "which ui.perfetto.dev and chrome://tracing open",
    )
    return parser


def _read(path: str) -> tuple[Timeline, dict[str, Any] | None]:
    """The timeline in ``path`` (a snapshot becomes a timeline of one moment), and the failed
    request it is marked with (the JSON an out-of-memory error saved), if any."""
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
            return Timeline.from_snapshot(Snapshot.load(path)), None
        except TidyjaxError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            raise TidyjaxError(f"{path}: a malformed tidyjax snapshot ({e!r}).") from e
    if kind == TIMELINE_FORMAT:
        oom = data.get("oom")
        return Timeline.from_json(data, where=path), oom if isinstance(oom, dict) else None
    raise TidyjaxError(
        f'{path}: not a tidyjax timeline or snapshot (its "format" is {kind!r}); write one '
        "with Timeline.dump(path) or tidyjax.snapshot().dump(path)."
    )


def _output(file: str, output: str | None) -> str:
    """Where the page goes: ``output``, inside it when it is a folder, else beside ``file``."""
    page = os.path.splitext(os.path.basename(file))[0] + ".html"
    if not output:
        return os.path.join(os.path.dirname(file), page)
    if output.endswith(("/", os.sep)) or os.path.isdir(output):
        return os.path.join(output, page)
    return output


def _write(what: str, path: str, write: Callable[[str], object]) -> str | None:
    """Write with ``write(path)`` after creating the folders; the error line, or None."""
    try:
        folder = os.path.dirname(path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        write(path)
    except OSError as e:
        return f"tidyjax view: {path}: cannot write the {what} ({e.strerror or e})."
    return None


def _view(args: argparse.Namespace) -> int:
    try:
        tl, oom = _read(args.file)
    except TidyjaxError as e:
        print(f"tidyjax view: {e}", file=sys.stderr)
        return 2
    out = _output(args.file, args.output)

    def save_page(path: str) -> None:
        if oom is None:
            tl.save_html(path)
            return
        with open(path, "w", encoding="utf-8") as f:  # the failed request marked
            f.write(oom_page(tl, oom))

    problem = _write("page", out, save_page)
    if problem is None and args.chrome_trace:
        problem = _write("trace", args.chrome_trace, tl.to_chrome_trace)
        if problem is None:
            print(f"wrote {args.chrome_trace} (open it in https://ui.perfetto.dev)")
    if problem is not None:
        print(problem, file=sys.stderr)
        return 2
    url = pathlib.Path(out).resolve().as_uri()
    print(f"wrote {out}")
    if args.open:
        try:
            opened = webbrowser.open(url)
        except webbrowser.Error:
            opened = False
        if opened:
            return 0
        print("tidyjax view: no web browser could be started; open this URL:", file=sys.stderr)
    print(url)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    if args.command == "view":
        return _view(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
