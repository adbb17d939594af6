"""Which modules and folders of ``umlos_cuda`` one ``umlos-cuda`` command runs, and how often it crosses folders.

Usage::

    PYTHONPATH=$PWD python bench/trace_modules.py [--json] -- plan build --window 64 --mix a:0.7 b:0.3 ...
    PYTHONPATH=$PWD python bench/trace_modules.py --example all [--folder DIR --keep]

**Method.** The command runs in this interpreter, as the console script runs it (``umlos_cuda.cli.main(ARGV)``,
its stdout sent to stderr), with a profile function installed by ``sys.setprofile`` and ``threading.setprofile``
(so threads the command starts are traced too) from just before ``umlos_cuda.cli`` is imported until ``main``
returns: nothing of ``umlos_cuda`` is imported before (the package root is found with ``importlib.util.find_spec``,
which does not run it). Only ``"call"`` events are counted: a Python function, a module body or a class body starting,
and a generator or coroutine resuming (``sys.setprofile`` reports each resumption as a call). C functions are not.
An event counts when its code object's file (``co_filename``) lies inside the package folder; its module is that
file's dotted path, its folder the file's folder relative to the package (``batching/plans/windows``; ``batching``
for ``batching/collate.py``; ``.`` for ``umlos_cuda/errors.py``).

Each event is **import time** when a module body of ``umlos_cuda`` (code named ``<module>``) is on the stack at or
above it (the frame itself or any caller, up the ``f_back`` chain): a module executing on import, a class body, a
function a module body calls (registrations, constants). Every other event is **run time**: the command's own work.

Modules fall in three groups by file: **feature** (under ``umlos_cuda/batching/``), **command** (``cli.py`` and
``commands/``) and **foundation** (the rest: ``files/``, ``checks.py``, ``errors.py``, ``hashing.py``, ...). For each
group the report gives the distinct modules and folders with a run-time event (and the number of such events), and
the modules with an import-time event only.

**Folder switches** count run-time events of feature modules only: an event is a switch when its folder differs
from the folder of the previous run-time feature event *of the same thread* (the first one of a thread is not a
switch; events of command and foundation modules are skipped over, neither counted nor resetting). The same count
over every feature event, import time included, is given beside it.

**Modules imported**: the keys of ``sys.modules`` equal to ``umlos_cuda`` or starting with ``umlos_cuda.`` when
``main`` has returned (and those under ``umlos_cuda.batching``).

``--example mix`` / ``tokenize`` / ``all`` makes small inputs in a folder (a temporary one unless ``--folder``) and
traces, each in a fresh interpreter (this script, run again in that folder):

* ``mix``: a BPE tokenizer (vocabulary 300, trained with ``tokenizers`` as docs/batching.md's snippets train one),
  two Parquet files of 300 and 200 texts, each tokenized into a token store by ``data tokenize --workers 1`` (not
  traced), then ``plan build --window 64 --mix a:0.7 b:0.3 --bucket-edges 64,128,256 --overflow-max 512
  --token-budget 1024 --num-samples 400`` (:data:`MIX`);
* ``tokenize``: the ChatML tokenizer of docs/batching.md's "Chat records", a Parquet file of 300 conversations
  (a ``messages`` column of role/content structs), then ``data tokenize --dataset chat.parquet --messages-field
  messages --tokenizer chat-model --workers 1`` (:data:`TOKENIZE`; one worker: the encoding runs in a thread of
  this process, where the trace sees it).

The inputs are seeded: the same files, so the same counts, on every run of the same code. Both commands carry
``--force`` so that ``--folder`` can be reused, but replacing an existing output runs more code (foundation calls
differ): compare runs into a fresh folder, as the default temporary one is.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading

MAIN = "import sys; from umlos_cuda.cli import main; sys.exit(main(sys.argv[1:]))"
GROUPS = ("feature", "command", "foundation")

MIX = ["plan", "build", "--window", "64", "--mix", "a:0.7", "b:0.3", "--bucket-edges", "64,128,256",
       "--overflow-max", "512", "--token-budget", "1024", "--num-samples", "400", "--output", "mixed", "--quiet",
       "--force"]
TOKENIZE = ["data", "tokenize", "--dataset", "chat.parquet", "--messages-field", "messages", "--tokenizer",
            "chat-model", "--output", "chat-store", "--workers", "1", "--quiet", "--force"]


def package_root() -> str:
    """The folder of ``umlos_cuda``, found without importing it."""
    spec = importlib.util.find_spec("umlos_cuda")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("umlos_cuda is not importable: set PYTHONPATH to a checkout")
    return os.path.realpath(next(iter(spec.submodule_search_locations)))


def describe(relative: str) -> tuple[str, str, str]:
    """A file's module, folder and group, from its path relative to the package folder."""
    folder = os.path.dirname(relative) or "."
    parts = relative[:-3].split("/") if relative.endswith(".py") else relative.split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    module = ".".join(["umlos_cuda", *parts])
    if relative.startswith("batching/"):
        group = "feature"
    elif relative == "cli.py" or relative.startswith("commands/"):
        group = "command"
    else:
        group = "foundation"
    return module, folder, group


class Tracer:
    """The profile function and what it counted (module docstring)."""

    def __init__(self, root: str) -> None:
        self.prefix = root + os.sep
        self.files: dict[str, tuple[str, str, str] | None] = {}
        self.run_calls: collections.Counter[str] = collections.Counter()
        self.import_calls: collections.Counter[str] = collections.Counter()
        self.folders: dict[str, tuple[str, str]] = {}
        self.last_run: dict[int, str] = {}
        self.last_any: dict[int, str] = {}
        self.switches = 0
        self.switches_any = 0

    def where(self, filename: str) -> tuple[str, str, str] | None:
        """Module, folder and group of a code file, or None outside the package (cached per file name)."""
        if filename not in self.files:
            real = os.path.realpath(filename)
            self.files[filename] = describe(real[len(self.prefix):]) if real.startswith(self.prefix) else None
        return self.files[filename]

    def import_time(self, frame) -> bool:
        """Whether a module body of the package is on the stack at or above ``frame``."""
        while frame is not None:
            code = frame.f_code
            if code.co_name == "<module>" and self.where(code.co_filename) is not None:
                return True
            frame = frame.f_back
        return False

    def __call__(self, frame, event, arg) -> None:
        if event != "call":
            return
        found = self.where(frame.f_code.co_filename)
        if found is None:
            return
        module, folder, group = found
        self.folders[module] = (folder, group)
        thread = threading.get_ident()
        at_import = self.import_time(frame)
        (self.import_calls if at_import else self.run_calls)[module] += 1
        if group != "feature":
            return
        self.switches_any += thread in self.last_any and self.last_any[thread] != folder
        self.last_any[thread] = folder
        if not at_import:
            self.switches += thread in self.last_run and self.last_run[thread] != folder
            self.last_run[thread] = folder


def trace(argv: list[str]) -> dict:
    """Run ``umlos-cuda ARGV`` under a :class:`Tracer`; the report's numbers."""
    tracer = Tracer(package_root())
    status = None
    threading.setprofile(tracer)
    sys.setprofile(tracer)
    try:
        from umlos_cuda.cli import main

        with contextlib.redirect_stdout(sys.stderr):
            status = main(argv)
    except SystemExit as exc:
        status = exc.code
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return summarize(tracer, argv, status)


def summarize(tracer: Tracer, argv: list[str], status) -> dict:
    """Per group: the modules and folders with run-time events, their events, the import-time-only modules."""
    loaded = [name for name in sys.modules if name == "umlos_cuda" or name.startswith("umlos_cuda.")]
    groups = {}
    for group in GROUPS:
        ran = {m: n for m, n in sorted(tracer.run_calls.items()) if tracer.folders[m][1] == group}
        folders: collections.Counter[str] = collections.Counter()
        for module, calls in ran.items():
            folders[tracer.folders[module][0]] += calls
        groups[group] = {
            "modules": ran, "folders": dict(sorted(folders.items())),
            "import_only": sorted(m for m in tracer.import_calls if m not in ran and tracer.folders[m][1] == group),
        }
    return {"argv": argv, "status": status, "file": getattr(sys.modules.get("umlos_cuda"), "__file__", None),
            "modules_imported": len(loaded),
            "batching_imported": sum(name.startswith("umlos_cuda.batching") for name in loaded),
            "switches": tracer.switches, "switches_with_imports": tracer.switches_any, "groups": groups}


def report(result: dict) -> str:
    """The numbers of :func:`summarize` as text: a summary table, then the folders and modules."""
    lines = [f"command: umlos-cuda {' '.join(result['argv'])}", f"exit status: {result['status']}",
             f"umlos_cuda from: {result['file']}", "",
             "| group | modules run | folders | run-time calls | import-time-only modules |",
             "|---|---:|---:|---:|---:|"]
    for group, row in result["groups"].items():
        lines.append(f"| {group} | {len(row['modules'])} | {len(row['folders'])} | {sum(row['modules'].values())} "
                     f"| {len(row['import_only'])} |")
    lines += ["", f"folder switches (feature, run time): {result['switches']}",
              f"folder switches (feature, import time included): {result['switches_with_imports']}",
              f"umlos_cuda modules imported: {result['modules_imported']} "
              f"(umlos_cuda.batching: {result['batching_imported']})"]
    for group, row in result["groups"].items():
        lines += ["", f"{group} folders (run-time calls):"]
        lines += [f"  {folder:<28} {calls:>8}" for folder, calls in row["folders"].items()]
        lines += [f"{group} modules (run-time calls):"]
        lines += [f"  {module:<56} {calls:>8}" for module, calls in row["modules"].items()]
    return "\n".join(lines)


def train_tokenizer(texts: list[str], folder: str, special: list[str], vocab: int) -> None:
    """A byte-level BPE tokenizer trained on ``texts``, saved as ``folder/tokenizer.json`` (docs/batching.md)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=special[0]) if special[0] == "<unk>" else models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    os.makedirs(folder, exist_ok=True)
    tokenizer.save(os.path.join(folder, "tokenizer.json"))


def write_parquet(rows: list[dict], path: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)


def make_mix_inputs(folder: str, env: dict) -> None:
    """The tokenizer, two Parquet files and their token stores ``a`` and ``b`` (module docstring)."""
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "gravity", "explains",
             "why", "python", "is", "what", "it", "is"]
    rng = random.Random(1)
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 120))) for _ in range(500)]
    train_tokenizer(texts[:300], os.path.join(folder, "model"), ["<unk>", "<s>", "</s>"], 300)
    for name, part in (("a", texts[:300]), ("b", texts[300:])):
        write_parquet([{"id": f"{name}-{i:03d}", "text": text} for i, text in enumerate(part)],
                      os.path.join(folder, f"{name}.parquet"))
        run_cli(["data", "tokenize", "--dataset", f"{name}.parquet", "--tokenizer", "model", "--output", name,
                 "--workers", "1", "--quiet", "--force"], folder, env)


def make_chat_inputs(folder: str) -> None:
    """The ChatML tokenizer of docs/batching.md and ``chat.parquet``, 300 seeded conversations."""
    sentences = ["hello there how are you", "I am fine thank you", "what is the capital of france", "paris"]
    train_tokenizer(sentences * 4, os.path.join(folder, "chat-model"), ["<|im_start|>", "<|im_end|>", "<|endoftext|>"],
                    320)
    template = ("{% for message in messages %}"
                "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
                "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    with open(os.path.join(folder, "chat-model", "tokenizer_config.json"), "w") as handle:
        json.dump({"chat_template": template, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, handle)
    rng = random.Random(2)
    rows = []
    for i in range(300):
        turns = rng.randint(1, 4)
        messages = [{"role": role, "content": rng.choice(sentences)}
                    for _ in range(turns) for role in ("user", "assistant")]
        rows.append({"id": f"chat_{i:03d}", "messages": messages})
    write_parquet(rows, os.path.join(folder, "chat.parquet"))


def run_cli(argv: list[str], folder: str, env: dict) -> None:
    """``umlos-cuda ARGV`` in a fresh interpreter, in ``folder`` (an input's setup, not traced)."""
    subprocess.run([sys.executable, "-c", MAIN, *argv], cwd=folder, env=env, stdout=subprocess.DEVNULL, check=True)


def examples(which: str, folder: str, as_json: bool, env: dict) -> None:
    """Make the inputs of the chosen examples in ``folder`` and trace each command in a fresh interpreter."""
    chosen = ["mix", "tokenize"] if which == "all" else [which]
    for name in chosen:
        if name == "mix":
            make_mix_inputs(folder, env)
        else:
            make_chat_inputs(folder)
        argv = MIX if name == "mix" else TOKENIZE
        print(f"## example {name}\n", flush=True)
        subprocess.run([sys.executable, os.path.abspath(__file__), *(["--json"] if as_json else []), "--", *argv],
                       cwd=folder, env=env, check=True)
        print(flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--example", choices=["mix", "tokenize", "all"],
                        help="make the inputs of these example commands and trace them (module docstring)")
    parser.add_argument("--folder", help="where --example writes its inputs (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep --example's folder")
    parser.add_argument("--pythonpath", default=os.environ.get("PYTHONPATH", os.getcwd()),
                        help="with --example: the checkout to trace (default: $PYTHONPATH, else the working folder)")
    parser.add_argument("--json", action="store_true", help="print the numbers as one JSON object")
    parser.add_argument("argv", nargs="*", help="the command's arguments, after --")
    args = parser.parse_args()
    if args.example:
        env = {**os.environ, "PYTHONPATH": os.path.abspath(args.pythonpath)}
        folder = os.path.abspath(args.folder) if args.folder else tempfile.mkdtemp(prefix="trace-modules-")
        os.makedirs(folder, exist_ok=True)
        try:
            examples(args.example, folder, args.json, env)
        finally:
            if not args.keep:
                shutil.rmtree(folder, ignore_errors=True)
        return
    if not args.argv:
        parser.error("give the command after --, or --example")
    result = trace(args.argv)
    print(json.dumps(result) if args.json else report(result))


if __name__ == "__main__":
    main()
