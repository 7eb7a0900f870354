"""The ``otel-guard`` command: ``demo`` and ``replay`` (docs/contract.md section 7).

Exit status: 0 when every input was read; 1 when an input file could not be read or held a
malformed line (the one-line message ``FILE:LINE: what`` goes to stderr and the report of
everything read before it still goes to stdout); 2 for a usage error; 130 when interrupted
(the report of what was read is still printed).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import sys
import time
from collections.abc import Iterator, Sequence
from typing import IO

from otel_guard.otlp_json import MalformedInput, OtlpJsonReader
from otel_guard.reducer import parse_mode
from otel_guard.replay import Replayer
from otel_guard.version import __version__

__all__ = ["main"]

EXIT_OK = 0
EXIT_INPUT = 1
EXIT_INTERRUPTED = 130


def _mode(value: str) -> str:
    mode = parse_mode(value)
    if mode is None:
        raise argparse.ArgumentTypeError(
            f"invalid mode {value!r} (choose from off, shadow, warn, enforce)"
        )
    return mode


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="otel-guard",
        description="Repeated tool-failure guard for AI agents: demo and trace replay.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="run simulated agent sessions through the guard",
        description="Run built-in simulated agent sessions through a real TracerProvider with "
        "the guard and print what it decided, batch by batch.",
    )
    demo.add_argument("--mode", type=_mode, default="shadow", help="guard mode (default shadow)")
    demo.add_argument(
        "--out", metavar="FILE", help="also write every span to FILE as OTLP/JSON lines"
    )

    replay = commands.add_parser(
        "replay",
        help="replay OTLP/JSON trace files through the guard",
        description="Replay OTLP/JSON trace files (one ExportTraceServiceRequest per line, as "
        "the OpenTelemetry Collector file exporter writes them; gzip accepted) through the "
        "guard, in the order the spans started and ended, and report what it would decide.",
    )
    replay.add_argument("--mode", type=_mode, default="shadow", help="guard mode (default shadow)")
    replay.add_argument(
        "--format", choices=("text", "json"), default="text", help="report format (default text)"
    )
    replay.add_argument("files", nargs="+", metavar="FILE", help="OTLP/JSON files, read as one")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            return _demo(args.mode, args.out)
        return _replay(args.mode, args.format, args.files)
    except BrokenPipeError:
        # The reader of our output went away (``| head``); nothing left to say.
        sys.stderr.close()
        return EXIT_OK


def _demo(mode: str, out_path: str | None) -> int:
    # Imported here: the replay command does without the demo's sessions and producer.
    from otel_guard.demo import run_demo

    if out_path is None:
        run_demo(mode, sys.stdout)
        return EXIT_OK
    try:
        with open(out_path, "w", encoding="utf-8") as stream:
            run_demo(mode, sys.stdout, stream)
    except OSError as error:
        print(f"{out_path}: cannot write ({error.strerror or error})", file=sys.stderr)
        return EXIT_INPUT
    print(f"\nspans written to {out_path}", file=sys.stdout)
    return EXIT_OK


_BULK_GC_THRESHOLD = 20_000


@contextlib.contextmanager
def _bulk_collection() -> Iterator[None]:
    """Run the cyclic garbage collector rarely, and never over the objects loaded at start-up.

    Each decoded line is tens of thousands of short-lived containers that reference counting
    frees; by default the collector runs every 700 of them and its full passes rescan every
    imported module, about a fifth of a replay's time, to find next to nothing.
    """
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(thresholds[0], _BULK_GC_THRESHOLD), *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def _replay(mode: str, output_format: str, files: Sequence[str]) -> int:
    with _bulk_collection():
        return _replay_files(mode, output_format, files)


def _replay_files(mode: str, output_format: str, files: Sequence[str]) -> int:
    reader = OtlpJsonReader(files)
    replayer = Replayer(mode)
    progress = _Progress(sys.stderr) if sys.stderr.isatty() else None
    error: str | None = None
    status = EXIT_OK
    spans = 0
    try:
        for line in reader:
            replayer.add(line.spans)
            spans += len(line.spans)
            if progress is not None:
                progress.update(reader.bytes_read, reader.total_bytes, spans)
    except MalformedInput as malformed:
        error, status = str(malformed), EXIT_INPUT
    except KeyboardInterrupt:
        # Report what was read so far, as for malformed input.
        error, status = "interrupted", EXIT_INTERRUPTED
    finally:
        if progress is not None:
            progress.clear()
    report = replayer.finish()
    if error is not None:
        print(error, file=sys.stderr)
    unreadable = report.unreadable()
    if unreadable is not None:
        shown = ", ".join(files)
        print(
            f"{shown}: {report.total.spans} spans, no prompt the guard can read: {unreadable}",
            file=sys.stderr,
        )
    if output_format == "json":
        document = report.to_json()
        document["files"] = list(files)
        document["error"] = error
        print(json.dumps(document, indent=2))
    else:
        print(report.render_text())
        if error is not None:
            print(f"input stopped early: {error}")
    return status


class _Progress:
    """A one-line progress bar, redrawn at most ten times a second."""

    WIDTH = 30

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._last = 0.0
        self._drawn = False

    def update(self, done: int, total: int, spans: int) -> None:
        now = time.monotonic()
        if now - self._last < 0.1:
            return
        self._last = now
        fraction = min(done / total, 1.0) if total else 0.0
        filled = int(fraction * self.WIDTH)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        self._stream.write(f"\r[{bar}] {fraction:4.0%}  {spans:,} spans")
        self._stream.flush()
        self._drawn = True

    def clear(self) -> None:
        if self._drawn:
            self._stream.write("\r" + " " * (self.WIDTH + 40) + "\r")
            self._stream.flush()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
