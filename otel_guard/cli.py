"""The ``otel-guard`` command: ``demo``, ``replay`` and ``merge`` (docs/contract.md section 7).

Exit status of ``replay`` and ``merge``, the gate of a rollout step (the report is printed in
every case; the first that applies, in this order):

* 130 -- interrupted (with ``--jobs`` the processes stop before they report: no report);
* 2 -- usage error (bad flag, a missing extra);
* 1 -- an input could not be read whole: unreadable, malformed or truncated (the one-line
  message ``FILE:LINE: what`` goes to stderr), or, for ``merge``, a report of such a replay or
  a report that cannot be read or is not a valid replay report (the others are merged);
* 6 -- ``merge`` only: a report was left out, the others merged: replayed with another mode or
  other constants than the first, or given twice (the same file, a copy, or a report already
  inside a merged report given);
* 5 -- an invariant was violated;
* 3 -- no span was read;
* 4 -- spans were read, but no prompt the guard can read (in mode ``off``, where the guard reads
  none, a shadow replay beside it looks for one until it finds it: ``readable_prompt``);
* 7 -- the report passed, but the ``--html`` file could not be written;
* 0 -- otherwise. ``--allow-empty`` turns 3 and 4 into 0.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any, Final

from opentelemetry.sdk.trace import ReadableSpan

from otel_guard.reducer import BATCH_THRESHOLD, THRESHOLD, parse_mode
from otel_guard.replay.reader import MalformedInput, TraceReader
from otel_guard.replay.recorded import ID_CHARS_LIMIT
from otel_guard.replay.replayer import (
    DEFAULT_MAX_OPEN_TRACES,
    DEFAULT_MAX_TRACE_SPANS,
    DEFAULT_REORDER_WINDOW,
    REMEMBERED_TRACES,
    SWEEP_THRESHOLDS,
    Replayer,
)
from otel_guard.replay.report import (
    BOUNDS,
    DAY_LIMIT,
    EXIT_INCOMPLETE,
    EXIT_NO_SPANS,
    EXIT_NOT_WRITTEN,
    GROUP_LIMIT,
    TIMELINE_LIMIT,
    is_complete,
    merge_reports,
    printable,
    render_text,
    report_parts,
    sweeps_match,
    unreadable,
    verdict,
)
from otel_guard.replay.trace_input import MAX_EMPTY_FRAMES
from otel_guard.spans.acp import opted_out
from otel_guard.spans.attributes import PROMPT_ID
from otel_guard.version import __version__

__all__ = ["main"]

EXIT_OK = 0
EXIT_INPUT = EXIT_INCOMPLETE
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


_MODE_HELP: Final = (
    "guard mode: off, shadow (count only), warn (remind the model) or enforce (remind, then "
    "stop); default shadow"
)


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
    demo.add_argument("--mode", type=_mode, default="shadow", metavar="MODE", help=_MODE_HELP)
    demo.add_argument(
        "--out", metavar="FILE", help="also write every span to FILE as OTLP/JSON lines"
    )

    replay = commands.add_parser(
        "replay",
        help="replay recorded OTLP trace files through the guard",
        description="Replay recorded OTLP traces through the guard, in the order the spans "
        "started and ended, and report what it would decide. Input as the OpenTelemetry "
        "Collector file exporter writes it: OTLP/JSON lines (one ExportTraceServiceRequest per "
        "line) or its proto format (length-prefixed protobuf frames), plain, gzip or zstd "
        "(zstd needs the zstd extra before Python 3.14); '-' reads standard input. "
        "Exit status: 0 when every input was read whole, a guard-readable prompt was found and "
        "no invariant was violated; 1 input stopped early, 3 no spans, 4 no guard-readable "
        "prompt, 5 an invariant violated, 7 the --html file could not be written, 2 usage, "
        "130 interrupted. The report is printed in every case but one: an interrupt of "
        "--jobs stops its processes before they report.",
    )
    replay.add_argument("--mode", type=_mode, default="shadow", metavar="MODE", help=_MODE_HELP)
    replay.add_argument(
        "--format", choices=("text", "json"), default="text", help="report format (default text)"
    )
    replay.add_argument(
        "--threshold",
        type=_positive,
        default=THRESHOLD,
        metavar="N",
        help=f"what-if: failures before a warning (live guard: {THRESHOLD}; analysis only)",
    )
    replay.add_argument(
        "--batch-threshold",
        type=_positive,
        default=BATCH_THRESHOLD,
        metavar="M",
        help=f"what-if: batches before a warning (live guard: {BATCH_THRESHOLD}; analysis only)",
    )
    replay.add_argument(
        "--sweep",
        action="store_true",
        help="also replay thresholds "
        + ", ".join(str(t) for t in SWEEP_THRESHOLDS)
        + " and compare would-stop prompts, self-recovered prompts and saved work",
    )
    replay.add_argument(
        "--html",
        metavar="FILE",
        help="also write a self-contained HTML report with plots (opens offline; implies --sweep)",
    )
    replay.add_argument(
        "--jobs",
        type=_positive,
        default=1,
        metavar="N",
        help="replay in N processes, each owning a shard of the prompts; plain JSON-lines files "
        "are decoded in byte ranges split among them, other input is read by each; '-', pipes "
        "and other input that is not a regular file are first read once into a temporary file. "
        "N is lowered, with a notice, to what the limit on open files allows (21 at "
        "ulimit -n 1024) (default 1)",
    )
    replay.add_argument(
        "--allow-empty",
        action="store_true",
        help="exit 0 even when no span or no guard-readable prompt was read",
    )
    replay.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="trace files (JSON lines or proto frames; .gz, .zst) or '-', read as one input",
    )

    merge = commands.add_parser(
        "merge",
        help="merge JSON replay reports of shards into one",
        description="Merge reports written by 'otel-guard replay --format json' for disjoint "
        "shards of the prompts (for example, replays of different days or hosts) into the "
        "report one replay of everything would give. A report that cannot be merged is left "
        "out and named, and the others are merged and printed. Exit status as for replay, of "
        "the merged report: 1 also when a report cannot be read, is not a valid replay report, "
        "or comes from a replay whose input stopped early; 6 when a report was left out: "
        "replayed with another mode or other constants, or given twice (the same file, a copy, "
        "or a report already inside a merged one). Reports whose what-if sweeps differ merge "
        "without a sweep.",
    )
    merge.add_argument(
        "--format", choices=("text", "json"), default="json", help="report format (default json)"
    )
    merge.add_argument("--html", metavar="FILE", help="also write the HTML report")
    merge.add_argument(
        "--allow-empty",
        action="store_true",
        help="exit 0 even when the reports hold no span or no guard-readable prompt",
    )
    merge.add_argument("reports", nargs="+", metavar="REPORT.json", help="JSON replay reports")
    return parser


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return number


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    if getattr(args, "html", None) is not None and importlib.util.find_spec("matplotlib") is None:
        # Said before the replay runs, not after it: the page's plots need the html extra.
        print("--html needs matplotlib: install otel-guard[html]", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.command == "demo":
            return _demo(args.mode, args.out)
        if args.command == "merge":
            return _merge(args.reports, args.format, args.html, args.allow_empty)
        return _replay(args)
    except BrokenPipeError:
        # The reader of our output went away (``| head``); nothing left to say.
        sys.stderr.close()
        return EXIT_OK


def _warn(message: str) -> None:
    """One line on stderr: file names and input text in it are escaped (``printable``), so that
    neither a newline nor a terminal escape in them reaches the terminal raw."""
    print(printable(message), file=sys.stderr)


def _demo(mode: str, out_path: str | None) -> int:
    # Imported here: the replay command does without the demo's sessions and producer.
    from otel_guard.demo import run_demo

    stdout = _StdoutReader()
    if out_path is None:
        run_demo(mode, stdout)
        stdout.flush()
        return EXIT_OK
    try:
        with open(out_path, "w", encoding="utf-8") as stream:
            run_demo(mode, stdout, stream)
    except OSError as error:
        # Only FILE's: standard output's errors end in ``stdout``.
        _warn(f"{out_path}: cannot write ({error.strerror or error})")
        return EXIT_INPUT
    print(f"\nspans written to {printable(out_path)}", file=stdout)
    stdout.flush()
    return EXIT_OK


class _StdoutReader:
    """Standard output for the demo's timeline, whose reader may go away (``| head``).

    From then on what is printed is dropped and the demo runs on, so that ``--out`` still
    receives every span and the status is the run's, as ``replay`` keeps its report's status
    when the reader of the report went away."""

    def __init__(self) -> None:
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                sys.stdout.write(text)
            except BrokenPipeError:
                self._leave()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                sys.stdout.flush()
            except BrokenPipeError:
                self._leave()

    def _leave(self) -> None:
        self.gone = True
        _silence_stdout()


# Net new containers between young-generation passes. A replay keeps tens of thousands alive
# (the spans of its reorder window, a few containers each) and every tenth pass goes on to the
# older generations that hold them: rarer passes traverse them fewer times, to find as little.
_BULK_GC_THRESHOLD = 100_000


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


def _replay(args: argparse.Namespace) -> int:
    options: dict[str, Any] = {
        "threshold": args.threshold,
        "batch_threshold": args.batch_threshold,
        "sweep": SWEEP_THRESHOLDS if args.sweep or args.html is not None else (),
    }
    jobs = args.jobs
    if jobs > 1:
        from otel_guard.replay.shards import jobs_within_open_files

        jobs = jobs_within_open_files(jobs)
        if jobs < args.jobs:
            print(
                f"replay: --jobs {args.jobs} would open more files than ulimit -n allows:"
                f" replaying in {jobs} process{'es' if jobs > 1 else ''}",
                file=sys.stderr,
            )
    with _bulk_collection():
        if jobs > 1:
            try:
                document, error, interrupted, census = _replay_sharded(
                    args.mode, options, args.files, jobs
                )
            except KeyboardInterrupt:
                # The processes were stopped before they reported: nothing to merge.
                print("interrupted", file=sys.stderr)
                return EXIT_INTERRUPTED
        else:
            document, error, interrupted, census = _replay_files(args.mode, options, args.files)
    if interrupted:
        error = "interrupted"
    if error is not None:
        _warn(error)
    document["files"] = list(args.files)
    document["error"] = error
    document["complete"] = error is None
    if args.mode == "off":
        document["readable_prompt"] = census.found
    _print_bounds(document)
    missing = unreadable(document, opted_out=len(census.opted_out), seen=census.seen)
    if missing is not None:
        shown = ", ".join(args.files)
        _warn(f"{shown}: {document['spans']} spans, no prompt the guard can read: {missing}")
    status = _gate(document, args.allow_empty, ", ".join(args.files))
    if interrupted:
        status = document["verdict"]["status"] = EXIT_INTERRUPTED
    return _output(document, args.format, args.html, status)


def _gate(document: dict[str, Any], allow_empty: bool, inputs: str) -> int:
    """The exit status of a report, saying on stderr what the report alone does not."""
    result = verdict(document, allow_empty=allow_empty)
    document["verdict"] = {"status": result.status, "reasons": list(result.reasons)}
    if document.get("complete") and result.status == EXIT_NO_SPANS:
        _warn(f"{inputs}: no spans read (--allow-empty accepts it)")
    if document.get("invariant_violations"):
        broken = ", ".join(
            f"{name} {count}" for name, count in document.get("invariants", {}).items() if count
        )
        print(f"invariant violations: {broken}", file=sys.stderr)
    return result.status


class _PromptCensus:
    """What the input says of its prompts, for the gate when the replay counted none: whether a
    shadow replay beside a replay in mode ``off`` (whose guard reads nothing) finds a prompt,
    and the prompts named by spans that opt them out. It looks only until a prompt is found."""

    _OPTED_OUT_LIMIT: Final = 10_000

    def __init__(self, mode: str, options: Mapping[str, Any]) -> None:
        self.probe: Replayer | None = None
        if mode == "off":
            self.probe = Replayer(
                "shadow", threshold=options["threshold"], batch_threshold=options["batch_threshold"]
            )
        self.found = False
        self.opted_out: set[str] = set()
        self.seen: Mapping[str, int] | None = None
        """In mode off, what the shadow replay's GenAI profile saw (the replay's own sees none)."""

    def add(self, spans: Sequence[Any], replayer: Replayer | None = None) -> None:
        for span in spans:
            if isinstance(span, ReadableSpan) and len(self.opted_out) < self._OPTED_OUT_LIMIT:
                attributes = span.attributes or {}
                prompt = attributes.get(PROMPT_ID)
                if isinstance(prompt, str) and opted_out(attributes):
                    self.opted_out.add(prompt)
        if self.probe is not None:
            self.probe.add(spans)
            self.found = bool(self.probe.report.total["prompts"])
        elif replayer is not None:
            self.found = bool(replayer.report.total["prompts"])

    def finish(self) -> None:
        if self.probe is not None and not self.found:
            report = self.probe.finish()
            self.found = bool(report.total["prompts"])
            if not self.found:
                self.seen = dict(report.genai_seen)
        self.probe = None

    def read(self, files: Sequence[str]) -> None:
        """Look through the input again (after a replay in several processes)."""
        try:
            for line in TraceReader(files):
                self.add(line.spans)
                if self.found:
                    break
        except MalformedInput:
            pass  # the replay said so already
        self.finish()


def _replay_files(
    mode: str, options: dict[str, Any], files: Sequence[str]
) -> tuple[dict[str, Any], str | None, bool, _PromptCensus]:
    reader = TraceReader(files)
    replayer = Replayer(mode, **options)
    done = _PromptCensus(mode, options)
    census: _PromptCensus | None = done
    progress = _Progress(sys.stderr) if sys.stderr.isatty() else None
    error: str | None = None
    interrupted = False
    spans = 0
    try:
        for line in reader:
            replayer.add(line.spans)
            if census is not None:
                census.add(line.spans, replayer)
                if census.found:
                    census = None  # a prompt was found: nothing more to look for
            spans += len(line.spans)
            if progress is not None:
                progress.update(reader.bytes_read, reader.total_bytes, spans)
    except MalformedInput as malformed:
        error = str(malformed)
    except KeyboardInterrupt:
        # Report what was read so far, as for malformed input.
        interrupted = True
    finally:
        if progress is not None:
            progress.clear()
    replayer.report.skipped.update(reader.skipped)
    document = replayer.finish().to_json()
    if census is not None and not interrupted:
        census.finish()
    done.found = done.found or bool(document["prompts"])
    return document, error, interrupted, done


def _replay_sharded(
    mode: str, options: dict[str, Any], files: Sequence[str], jobs: int
) -> tuple[dict[str, Any], str | None, bool, _PromptCensus]:
    from otel_guard.replay.shards import replay_sharded

    census = _PromptCensus(mode, options)
    with contextlib.ExitStack() as spools:
        # Every process reads all input (or its own byte ranges of it): a stream (standard
        # input, a pipe, a FIFO, a character device) would give each process a part of it, so
        # it is read once, into a file they share.
        spooled, spool_error = _spool_streams(files, spools)
        named = [spooled.get(path, path) for path in files]
        document, error, interrupted = replay_sharded(named, mode, options, jobs)
        if not interrupted and (mode == "off" or not document["prompts"]) and document["spans"]:
            census.read(named)
    for path, spool in spooled.items():
        if error is not None and error.startswith(f"{spool}:"):
            error = path + error[len(spool) :]  # the input as given, not the spool file
    return document, spool_error or error, interrupted, census


def _is_stream(path: str) -> bool:
    """Whether ``path`` is input that cannot be read twice: ``-``, or anything but a regular
    file (a pipe, a FIFO, a socket, a character device such as ``/dev/stdin``)."""
    if path == "-":
        return True
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False  # the replay names the input it cannot read


def _spool_streams(
    files: Sequence[str], spools: contextlib.ExitStack
) -> tuple[dict[str, str], str | None]:
    """Copy each stream of ``files`` once into a temporary file (removed with ``spools``);
    returns the temporary file of each, and what stopped a copy. A stream that cannot be opened
    is left out, so that the replay reports it as one process does. A copy that fails midway (a
    full disk, a read error) keeps what it copied: the replay reads that much, and the report
    says the input was not read whole, in one line naming it."""
    spooled: dict[str, str] = {}
    failed: str | None = None
    for path in dict.fromkeys(files):
        if not _is_stream(path):
            continue
        try:
            source = sys.stdin.buffer if path == "-" else open(path, "rb")  # noqa: SIM115
        except OSError:
            continue
        # Removed when the replay is done and ``spools`` closes it.
        # Unbuffered: a write that fails leaves nothing behind to fail again at its close.
        spool = tempfile.NamedTemporaryFile(prefix="otel-guard-input-", buffering=0)  # noqa: SIM115
        spools.enter_context(spool)
        try:
            _copy_stream(source, spool)
            spool.flush()
        except OSError as error:
            failed = failed or f"{path}: cannot read it whole ({error.strerror or error})"
        finally:
            if path != "-":
                source.close()
        spooled[path] = spool.name
    return spooled, failed


_ZERO_HEAD: Final = 4 * (MAX_EMPTY_FRAMES + 1)
"""Leading zero bytes that stop any reading: as many empty length prefixes as a reader takes
before it judges the input not to be frames."""


def _copy_stream(source: IO[bytes], spool: IO[bytes]) -> None:
    """Copy ``source`` whole, except a stream that starts with zero bytes (``/dev/zero``):
    its first :data:`_ZERO_HEAD` bytes give the replay the error one process gives, and it
    would never end."""
    head = source.read(_ZERO_HEAD)
    spool.write(head)
    if len(head) == _ZERO_HEAD and not head.strip(b"\0"):
        return
    shutil.copyfileobj(source, spool)


_BOUND_VALUES = {
    "trace_spans": DEFAULT_MAX_TRACE_SPANS,
    "open_traces": DEFAULT_MAX_OPEN_TRACES,
    "report_groups": GROUP_LIMIT,
    "report_days": DAY_LIMIT,
    "timeline": TIMELINE_LIMIT,
    "prompt_ids": ID_CHARS_LIMIT,
    "replayed_traces": REMEMBERED_TRACES,
    "late_spans": DEFAULT_REORDER_WINDOW,
}


def _print_bounds(document: dict[str, Any]) -> None:
    """One line on stderr per bound the replay hit: the totals stay exact, the detail coarser."""
    for name, count in document.get("bounds", {}).items():
        if count and name in BOUNDS:
            print(
                f"replay: {BOUNDS[name]} ({_BOUND_VALUES[name]:,}), {count:,} times",
                file=sys.stderr,
            )


def _output(document: dict[str, Any], output_format: str, html: str | None, status: int) -> int:
    if html is not None:
        from otel_guard.replay.report_html import render_html

        try:
            with open(html, "w", encoding="utf-8") as stream:
                stream.write(render_html(document))
        except OSError as error:
            # Its own status: the judged input was fine, and 1 would say it was not read whole.
            message = f"{html}: cannot write ({error.strerror or error})"
            _warn(message)
            status = status or EXIT_NOT_WRITTEN
            gate = document.setdefault("verdict", {"status": 0, "reasons": []})
            gate["status"] = status
            gate["reasons"] = [*gate.get("reasons", []), f"HTML report not written: {message}"]
    try:
        if output_format == "json":
            print(json.dumps(document, indent=2))
        else:
            print(render_text(document))
            if document.get("error") is not None:
                print(f"input stopped early: {printable(document['error'])}")
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader of the report went away (``| head``): the gate's status still holds.
        _silence_stdout()
    return status


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush of a closed pipe does
    not print an error at exit."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


_SETTINGS: Final = ("mode", "threshold", "batch_threshold")


def _merge(paths: Sequence[str], output_format: str, html: str | None, allow_empty: bool) -> int:
    """Merge the reports that can be merged and print the result; each report that cannot is
    named on stderr and in the merged report (``error`` or ``left_out``), and sets the status."""
    from otel_guard.replay.report_schema import InvalidReport, load_report

    documents: list[dict[str, Any]] = []
    kept: list[str] = []
    unread: list[str] = []
    left_out: list[dict[str, str]] = []
    owner: dict[str, str] = {}  # identity of a replay report -> the path that gave it
    for path in paths:
        try:
            document = load_report(path)
        except OSError as error:
            unread.append(f"{path}: cannot read ({error.strerror or error})")
            continue
        except InvalidReport as error:
            unread.append(f"{path}: {error}")
            continue
        reason = _cannot_join(document, documents[0] if documents else None, owner)
        if reason is not None:
            left_out.append({"report": path, "reason": reason})
            continue
        owner.update(dict.fromkeys(report_parts(document), path))
        documents.append(document)
        kept.append(path)
    for message in unread:
        _warn(message)
    for entry in left_out:
        _warn(f"{entry['report']}: left out of the merge: {entry['reason']}")
    merged = merge_reports(documents or [dict.fromkeys(_SETTINGS)])
    for path, document in zip(kept, documents, strict=True):
        if not is_complete(document):
            shown = document.get("error") or "input stopped early"
            _warn(f"{path}: a replay whose input stopped early: {shown}")
    if documents and not sweeps_match(documents):
        _warn(
            "the reports' what-if sweeps differ (thresholds, or a sweep in some only): "
            "the merged report has none"
        )
    merged.setdefault("files", [])
    # What the merge adds up, so that a later merge given one of these again can tell.
    merged["parts"] = [part for document in documents for part in report_parts(document)]
    if unread:
        merged["error"] = "; ".join(filter(None, [merged.get("error"), *unread]))
        merged["complete"] = False
    if left_out:
        merged["left_out"] = [*merged.get("left_out", []), *left_out]
    _print_bounds(merged)  # as a replay of the whole input would
    return _output(merged, output_format, html, _gate(merged, allow_empty, ", ".join(paths)))


def _cannot_join(
    document: Mapping[str, Any], first: Mapping[str, Any] | None, owner: Mapping[str, str]
) -> str | None:
    """Why ``document`` cannot join a merge that took ``first`` (and the reports whose
    identities ``owner`` maps to their paths), or ``None``."""
    if first is not None:
        for key in _SETTINGS:
            if document.get(key) != first.get(key):
                return f"replayed with {key} {document.get(key)!r}, the others {first.get(key)!r}"
    if not document.get("spans"):
        return None  # adds nothing, whether given once or twice
    for part in report_parts(document):
        if part in owner:
            return (
                f"the same replay as {owner[part]} (given twice, a copy, or part of a merge):"
                " it would be counted twice"
            )
    return None


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
