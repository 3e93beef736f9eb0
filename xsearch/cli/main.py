"""The ``xsearch`` command: the parser, its command table, and what an error becomes.

An error the user can fix (``XSearchError``: a bad flag, value, file, setting) prints one line and
exits with status 2. Anything else exits with status 1 after one line that says what it is (a
system error such as a full disk, or a bug in xsearch) and names the file the traceback went to.
Each command group is one module of this package; only the module of the command being run is
imported (``xsearch predict`` imports neither torch nor optuna).
"""

from __future__ import annotations

import importlib
import logging
import sys
import time
import traceback
from pathlib import Path

from xsearch.cli.args import Parser
from xsearch.errors import XSearchError

EXIT_BUG = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

#: command -> (module of xsearch.cli that registers it, one line of help)
COMMANDS = {
    "list": ("catalog", "the attention variants"),
    "spaces": ("catalog", "the shipped search spaces"),
    "train": ("training", "train a model on a task and save it"),
    "pretrain": ("training", "self-pretrain a model on a task's own inputs (masked-token denoising; resumable)"),
    "eval": ("training", "evaluate a saved model"),
    "adapt": ("training", "fit task adapters (bottleneck or LoRA) to a saved model"),
    "search": ("search", "hardware-aware architecture search (Optuna; one or many workers)"),
    "report": ("search", "Pareto plots, trials.csv and front.json of a study"),
    "pick": ("search", "the best feasible trial under a latency budget, as config.json"),
    "supernet": ("supernet", "a weight-sharing supernet over a space: train it (resumable), extract subnets"),
    "latency": ("latency", "latency data and the latency predictor (sweep, fit, predict)"),
    "compress": ("compress", "prune, fine-tune (optionally distil), quantize; before/after table"),
    "export": ("deploy", "export a saved model to ONNX (checked against onnxruntime)"),
    "bench": ("deploy", "latency of an ONNX model (and of its torch model with --vs)"),
    "predict": ("deploy", "JSONL predictions of an ONNX model (onnxruntime only)"),
    "generate": ("deploy", "text generated token by token by an exported decoder (onnxruntime only)"),
    "serve": ("deploy", "HTTP predictions: POST /predict, GET /health"),
    "run": ("pipeline", "the whole pipeline: search, pick, train, compress, export, verify (restartable)"),
}


def _command_in(argv: list[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(argv: list[str] | None = None) -> Parser:
    """The parser; with ``argv``, only the command it names gets its arguments (the others stay unimported)."""
    p = Parser(prog="xsearch", description="Search, compress and ship efficient Transformers.")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging (and tracebacks on stderr)")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser, metavar="COMMAND")
    chosen = None if argv is None else _command_in(argv)
    for name, (module, help_) in COMMANDS.items():
        s = sub.add_parser(name, help=help_, description=help_)
        if argv is None or name == chosen:
            importlib.import_module(f"xsearch.cli.{module}").register(name, s)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    verbose = "-v" in argv or "--verbose" in argv
    try:
        args = build_parser(argv).parse_args(argv)
        _setup_logging(args.verbose)
        return args.func(args)
    except XSearchError as e:
        print(f"xsearch: error: {e}".replace("xsearch: error: xsearch", "xsearch"), file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("xsearch: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # not the user's input: a failing system, or a bug; say which, and keep the traceback
        where = _save_traceback()
        if verbose:
            traceback.print_exc()
        first = (str(e).strip().splitlines() or [""])[0][:300]
        kind = "system error" if isinstance(e, OSError) else "internal error (a bug in xsearch, not in your input)"
        print(f"xsearch: {kind}: {type(e).__name__}: {first} (traceback: {where})", file=sys.stderr)
        return EXIT_BUG


def _save_traceback() -> str:
    import os
    import tempfile

    from xsearch.paths import cache_dir

    text = traceback.format_exc()
    name = f"traceback-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"
    for folder in (cache_dir() / "tracebacks", Path(tempfile.gettempdir())):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / name
            path.write_text(text, encoding="utf-8")
            return str(path)
        except OSError:
            continue
    return "(nowhere: no writable folder; run with -v to see it)"


def _setup_logging(verbose: bool) -> None:
    from rich.console import Console
    from rich.logging import RichHandler

    # Root at WARNING (libraries such as onnxruntime's quantizer log chatter at INFO on the root
    # logger); xsearch's own progress at INFO.
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(message)s",
        handlers=[RichHandler(console=Console(stderr=True), show_path=False, show_time=False)],
    )
    logging.getLogger("xsearch").setLevel(logging.DEBUG if verbose else logging.INFO)
    for noisy in ("torch", "onnxscript", "onnx_ir"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
