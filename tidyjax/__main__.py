"""``python -m tidyjax view FILE.json [-o FILE.html] [--open] [--chrome-trace FILE]``: draw a
dumped Timeline or Snapshot.

Writes the page (creating missing folders) and prints its ``file://`` URL, or opens it in the
default browser with ``--open`` (the standard library's ``webbrowser``). ``--chrome-trace``
also writes the timeline as Chrome trace-event JSON for Perfetto's UI. Exit status 0 when the
page was written, 2 when the file cannot be read or a file cannot be written (one line naming
the file and what was wrong, no traceback).

Every value of the file is checked before it is drawn (`_timeline_format.check` and the decoding
for a timeline, `Snapshot.from_json` for a snapshot): a file that is not JSON, nests too deeply, has
no version, or holds a value of the wrong type, out of range, NaN or infinite, is refused in that
one line. Should a check miss something, the error drawing it is still that one line.
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
from ._timeline_format import is_clock, is_count, short

SNAPSHOT_FORMAT = "tidyjax.snapshot"
_WRITE_SNAPSHOT = "tidyjax.snapshot().dump(path)"
#: What a check missed and the reading or drawing raised: still a one-line error.
_DATA_ERRORS = (ArithmeticError, AttributeError, LookupError, RecursionError, TypeError, ValueError)


def _clip(text: str, limit: int = 200) -> str:
    """``text`` cut to about ``limit`` characters, for a one-line message."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
    request it is marked with (the JSON an out-of-memory error saved), if any.

    Raises:
        TidyjaxError: the file cannot be read, is no tidyjax timeline or snapshot, or a
            malformed one; the message says which, in one line.
    """
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise TidyjaxError(f"{path}: cannot read it ({e.strerror or e}).") from e
    except RecursionError:
        raise TidyjaxError(
            f"{path}: not a tidyjax timeline or snapshot: its JSON is nested too deeply to read."
        ) from None
    except ValueError as e:  # a JSONDecodeError, a UnicodeDecodeError, too many digits
        raise TidyjaxError(f"{path}: not a JSON file ({e}).") from e
    kind = data.get("format") if isinstance(data, dict) else None
    if kind == SNAPSHOT_FORMAT:  # every field checked there, as Snapshot.load does
        return Timeline.from_snapshot(Snapshot.from_json(data, path)), None
    if kind == TIMELINE_FORMAT:
        tl = Timeline.from_json(data, where=path)
        return tl, _failure(data, path)
    if not isinstance(data, dict):
        what = f"the file holds {short(data)}, not an object"
    else:
        what = f'its "format" is {short(kind)}' if "format" in data else 'it has no "format"'
    raise TidyjaxError(
        f"{path}: not a tidyjax timeline or snapshot ({what}); write one with "
        f"Timeline.dump(path) or {_WRITE_SNAPSHOT}."
    )


def _failure(data: dict[str, Any], path: str) -> dict[str, Any] | None:
    """The failed request a timeline is marked with (``"oom"``, see ``_oom.oom_page``), checked;
    None when there is none."""
    oom = data.get("oom")
    if oom is None:
        return None
    problem = ""
    if type(oom) is not dict:
        problem = f"is {short(oom)}, not an object"
    elif not is_clock(oom.get("time")):
        problem = f'has the "time" {short(oom.get("time"))}, not a perf_counter reading'
    elif not (oom.get("requested") is None or is_count(oom["requested"])):
        problem = f'has the "requested" {short(oom["requested"])}, not null or an int from 0'
    else:
        for key in ("what", "called_at"):
            if not (oom.get(key) is None or type(oom[key]) is str):
                problem = f'has the "{key}" {short(oom[key])}, not null or a str'
    if problem:
        raise TidyjaxError(f'{path} is a malformed tidyjax timeline: its "oom" {problem}.')
    return oom


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


def _fail(message: str) -> int:
    """Print ``message`` as the one line of an error; the exit status 2."""
    print("tidyjax view: " + " ".join(message.splitlines()), file=sys.stderr)
    return 2


def _view(args: argparse.Namespace) -> int:
    try:
        tl, oom = _read(args.file)
    except TidyjaxError as e:
        return _fail(str(e))
    except _DATA_ERRORS as e:
        return _fail(
            f"{args.file}: cannot read it ({type(e).__name__}: {_clip(str(e))}); if tidyjax "
            "wrote this file, please report this."
        )
    out = _output(args.file, args.output)

    def save_page(path: str) -> None:
        page = tl.to_html() if oom is None else oom_page(tl, oom)  # the failed request marked
        with open(path, "w", encoding="utf-8") as f:
            f.write(page)

    try:
        problem = _write("page", out, save_page)
        if problem is None and args.chrome_trace:
            problem = _write("trace", args.chrome_trace, tl.to_chrome_trace)
            if problem is None:
                print(f"wrote {args.chrome_trace} (open it in https://ui.perfetto.dev)")
    except _DATA_ERRORS as e:
        return _fail(
            f"{args.file}: cannot draw it ({type(e).__name__}: {_clip(str(e))}); if tidyjax "
            "wrote this file, please report this."
        )
    if problem is not None:
        return _fail(problem.removeprefix("tidyjax view: "))
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
