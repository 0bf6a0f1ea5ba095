"""Code prompts from the Python standard library: each documented public function becomes a "write this
function" task built from its signature and docstring (text that ships with every Python, so no download).

Only pure-Python functions (``inspect.isfunction``) defined in the module itself are used, so the signature is
exact; the docstring is cleaned (``inspect.cleandoc``) and cut to its first paragraphs (``max_doc_chars``).
Docstrings change between Python versions, so a build records ``sys.version`` and is reproducible on the same
one. Functions are listed in (module, name) order; the split into train / held-out is a seeded shuffle.

A default value is shown only when its repr is a plain literal that reads back (``ast.literal_eval``) and is not
a set; other defaults show as ``...``. Their reprs hold memory addresses (``<function quote_plus at 0x7f..>``,
``<object object at 0x7f..>``) or hash-seed-dependent orders (sets of strings), which made the prompt text
change from one process to the next.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import warnings

STDLIB_MODULES = (
    "abc", "argparse", "ast", "base64", "bisect", "calendar", "cmd", "codecs", "colorsys", "configparser",
    "contextlib", "copy", "csv", "dataclasses", "difflib", "dis", "email.utils", "enum", "filecmp", "fnmatch",
    "fractions", "ftplib", "functools", "genericpath", "getopt", "gettext", "glob", "gzip", "hashlib", "heapq",
    "hmac", "html", "http.cookies", "imaplib", "inspect", "ipaddress", "json", "keyword", "linecache", "locale",
    "logging", "mimetypes", "ntpath", "numbers", "operator", "optparse", "os", "pathlib", "pickle", "pkgutil",
    "platform", "plistlib", "posixpath", "pprint", "quopri", "random", "re", "reprlib", "sched", "secrets",
    "shlex", "shutil", "smtplib", "socket", "statistics", "string", "struct", "subprocess", "tarfile", "tempfile",
    "textwrap", "threading", "token", "tokenize", "traceback", "types", "typing", "urllib.parse",
    "urllib.request", "uuid", "warnings", "weakref", "wsgiref.util", "xml.dom.minidom", "zipfile",
)

# More modules for training prompts only (build.py's train_extra.jsonl, issue 11's wider data). A separate tuple
# because the held-out split is a shuffle over STDLIB_MODULES' tasks: adding modules there would change which
# tasks are held out, and every earlier evaluation was on that set. Modules deprecated for removal are left out.
EXTRA_STDLIB_MODULES = (
    "asyncio.coroutines", "asyncio.events", "asyncio.format_helpers", "asyncio.runners", "asyncio.streams",
    "asyncio.tasks", "bz2", "cProfile", "code", "codeop", "collections", "compileall", "copyreg", "dbm", "doctest",
    "email.base64mime", "email.charset", "email.header", "email.iterators", "email.quoprimime",
    "encodings.punycode", "ensurepip", "fileinput", "getpass", "http.client", "http.server", "importlib.metadata",
    "importlib.util", "json.decoder", "json.encoder", "logging.config", "lzma", "multiprocessing.connection",
    "multiprocessing.util", "nturl2path", "pickletools", "profile", "pstats", "py_compile", "pyclbr", "pydoc",
    "runpy", "shelve", "site", "ssl", "symtable", "sysconfig", "tabnanny", "timeit", "tracemalloc", "unittest.case",
    "unittest.mock", "unittest.util", "venv", "webbrowser", "wsgiref.simple_server", "wsgiref.validate", "xml.sax",
    "xml.dom.expatbuilder", "xml.etree.ElementTree", "xml.sax.saxutils", "xmlrpc.client", "zipapp",
)


@dataclasses.dataclass(frozen=True)
class CodeTask:
    module: str
    name: str
    signature: str
    doc: str
    source: str = "stdlib"
    """Where the function comes from (``library_tasks.SOURCES``): the id's prefix."""

    @property
    def id(self) -> str:
        return f"{self.source}-{self.module}.{self.name}"

    @property
    def prompt(self) -> str:
        return (f"Write a Python function `{self.name}{self.signature}` that does the following:\n\n"
                f"{self.doc}\n\nReturn the complete function in a ```python code block.")


class _Elided:
    def __repr__(self) -> str:
        return "..."


def _stable_default(value) -> bool:
    if isinstance(value, (set, frozenset)):
        return False
    try:
        return ast.literal_eval(repr(value)) == value
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False


def stable_signature(func, *, annotations: bool = True) -> str:
    """``str(inspect.signature(func))`` with every default whose repr is not a stable literal shown as ``...``
    (and, with ``annotations=False``, no type annotations)."""
    sig = inspect.signature(func)
    params = [p if p.default is inspect.Parameter.empty or _stable_default(p.default) else p.replace(default=_Elided())
              for p in sig.parameters.values()]
    if not annotations:
        params = [p.replace(annotation=inspect.Parameter.empty) for p in params]
        sig = sig.replace(return_annotation=inspect.Signature.empty)
    return str(sig.replace(parameters=params))


def _clean_doc(doc: str, max_chars: int) -> str:
    paragraphs = [p.strip() for p in inspect.cleandoc(doc).split("\n\n") if p.strip()]
    out = ""
    for p in paragraphs:
        if out and len(out) + len(p) + 2 > max_chars:
            break
        out = f"{out}\n\n{p}" if out else p
    return out[:max_chars].rstrip()


def stdlib_tasks(modules=STDLIB_MODULES, *, min_doc_chars: int = 40, max_doc_chars: int = 600) -> list[CodeTask]:
    """Every public, documented pure-Python function of ``modules``, in (module, name) order."""
    tasks, seen = [], set()
    for mod_name in sorted(modules):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mod = importlib.import_module(mod_name)
        except Exception:  # noqa: BLE001 - a module missing from this build of Python is skipped
            continue
        for name, obj in sorted(vars(mod).items()):
            if name.startswith("_") or not inspect.isfunction(obj) or obj.__module__ != mod.__name__:
                continue
            doc = obj.__doc__
            if not doc or len(doc.strip()) < min_doc_chars:
                continue
            try:
                sig = stable_signature(obj)
            except (TypeError, ValueError):
                continue
            key = (mod.__name__, name)
            if key in seen:
                continue
            seen.add(key)
            tasks.append(CodeTask(module=mod_name, name=name, signature=sig, doc=_clean_doc(doc, max_doc_chars)))
    return tasks
