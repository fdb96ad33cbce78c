"""User code named in a config as ``package.module:name`` - an algorithm, model, dataset, partition, client
module or callback - imported without editing fedsim.

A plug-in string runs code: importing its module runs that module. So a string resolves only to user code of
the kind its field expects (:class:`Subclass` of the field's base class, or a function or class called as the
field's :class:`Signature`), never to ``builtins:eval``, ``os:system``, ``__main__`` or a function of a library
fedsim runs on (``numpy:load`` takes four arguments as a partition does); and a run folder's own config names no
code that resume imports unless the user says so (``fedsim run --resume RUN --trust-plugins``, or the same string
given to the same field on the command line: :func:`plugin_settings` lists what a config names)."""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from fedsim.errors import PluginError

# The libraries fedsim runs on, by top-level module (the dependencies in pyproject.toml; a test keeps the two
# together): a function of theirs is never a user's plug-in (numpy.load takes a partition's four arguments), so a
# function field never imports their modules; a class of theirs of the field's base is of its kind.
LIBRARIES = frozenset({"numpy", "torch", "torchvision", "ray", "pytorch_lightning", "lightning", "lightning_fabric",
                       "torchmetrics", "wandb", "PIL", "yaml", "pydantic", "pydantic_core", "tqdm", "matplotlib",
                       "pyarrow", "psutil", "dp_accounting", "scipy"})


class Kind(Protocol):
    """What a plug-in field takes; ``str(kind)`` words it for an error message. ``from_libraries``: whether a
    library fedsim runs on may provide it."""
    @property
    def from_libraries(self) -> bool: ...

    def fits(self, obj: Any) -> bool: ...


@dataclass(frozen=True)
class Subclass:
    """A class plug-in: a subclass of ``base``, named ``name`` in messages (its public path)."""
    base: type
    name: str
    from_libraries: bool = True  # a library's subclass of the base is of the kind (Lightning's own callbacks)

    def fits(self, obj: Any) -> bool:
        return inspect.isclass(obj) and issubclass(obj, self.base)

    def __str__(self) -> str:
        return f"a class subclassing {self.name}"


@dataclass(frozen=True)
class Signature:
    """A function plug-in (or a class): called with ``positional`` arguments in this order, then ``keywords``;
    returning what ``returns`` says."""
    positional: tuple[str, ...] = ()
    keywords: tuple[str, ...] = ()
    returns: str = ""
    from_libraries: bool = False  # a library's function is never the user's, though it may take these arguments

    def fits(self, obj: Any) -> bool:
        try:
            inspect.signature(obj).bind(*self.positional, **dict.fromkeys(self.keywords))
        except TypeError:
            return False
        except ValueError:
            return True  # nothing to read the parameters from: the call itself tells (:func:`user_call`)
        return True

    @property
    def call(self) -> str:
        return f"f({', '.join([*self.positional, *(f'{k}=' for k in self.keywords)])})"

    def __str__(self) -> str:
        return f"a function {self.call} returning {self.returns}"


# Where a config may name a plug-in (dotted keys of the raw config); a list's items are each one.
PLUGIN_KEYS = ("algorithm", "algorithm.name", "model.name", "model.client", "model.callbacks", "data.dataset",
               "data.partition", "data.partition.name")


def is_plugin(spec: str) -> bool:
    return ":" in spec


def _not_user_code(module_name: str, kind: Kind) -> str | None:
    """What a module is when it may not provide the plug-in: the standard library, the program Python runs, or
    (unless ``kind`` takes theirs) a library fedsim runs on. None for anything else."""
    top = module_name.split(".")[0]
    if top == "__main__":
        return "the program Python runs (__main__)"
    if top in sys.stdlib_module_names:
        return "the Python standard library"
    return f"{top}, a library fedsim runs on" if top in LIBRARIES and not kind.from_libraries else None


def load_plugin(spec: str, field: str, kind: Kind) -> Any:
    """The object ``spec`` names, of the ``kind`` the field takes, defined in the user's own code (neither the
    standard library, ``__main__``, nor, for a function, a library fedsim runs on). Anything else is a one-line
    error on ``field`` naming what it takes."""
    module_name, _, attr = spec.partition(":")
    if not (module_name and attr.isidentifier() and all(p.isidentifier() for p in module_name.split("."))):
        raise PluginError(f"{field}: {spec!r} is not 'package.module:name'; give an importable module and the name "
                          f"of {kind} in it")
    foreign = _not_user_code(module_name, kind)
    if foreign is not None:
        raise PluginError(f"{field}: {spec!r} names {foreign}, not your code; {field} takes {kind}")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as err:
        raise _unimportable(field, spec, err) from None
    own = inspect.isfunction(obj) or inspect.isclass(obj)
    defined_in = getattr(obj, "__module__", "") or ""
    if not own or _not_user_code(defined_in, kind) is not None:
        raise PluginError(f"{field}: {spec!r} is a {type(obj).__name__} from {defined_in or '?'}, not your code; "
                          f"{field} takes {kind}")
    if not kind.fits(obj):
        has = f" (it takes {inspect.signature(obj)})" if isinstance(kind, Signature) else ""
        raise PluginError(f"{field}: {spec!r} is not {kind}{has}; name one of your own code")
    return obj


def _unimportable(field: str, spec: str, why: object) -> PluginError:
    return PluginError(f"{field}: cannot import {spec!r} ({why}); give 'package.module:name' importable "
                       "on every worker (an installed package, or PYTHONPATH)")


def refuse_missing_modules(tree: dict[str, Any]) -> None:
    """A plug-in whose top-level package is nowhere on the path, refused as :func:`load_plugin` refuses it, before
    fedsim imports torch and Lightning (seconds) to build what would load it. Finding a top-level module runs none of
    its code (a package's parent would run for a dotted name, so only the top level is looked for here)."""
    for field, spec in plugin_settings(tree).items():
        top = spec.partition(":")[0].split(".")[0]
        if top and top.isidentifier() and not _findable(top):
            raise _unimportable(field, spec, f"No module named {top!r}")


def _findable(top: str) -> bool:
    """Whether a top-level module is on the path or already imported. A module imported without a spec (``__main__``
    of an interactive session, or of a test runner's worker) makes find_spec raise: it is there, and load_plugin
    decides what it holds."""
    try:
        return importlib.util.find_spec(top) is not None
    except ValueError:
        return top in sys.modules


@contextmanager
def user_call(spec: str, field: str, kind: Signature) -> Iterator[None]:
    """Around fedsim's call of a function plug-in as ``kind`` documents it (and the unpacking of what it returns):
    a TypeError is the user's code, said in one line naming the plug-in, never a traceback."""
    try:
        yield
    except TypeError as err:
        raise PluginError(f"{field}: {spec!r} failed when called as {kind.call} (TypeError: {err}); it must take "
                          f"those arguments and return {kind.returns}") from None


# A section given as its name alone (``algorithm: pkg.mod:Cls``) sets the same field as its ``name`` key.
SHORT_FORMS = {"algorithm": "algorithm.name", "data.partition": "data.partition.name"}


def plugin_settings(tree: dict[str, Any]) -> dict[str, str]:
    """Field -> plug-in string, for every plug-in a raw config tree names (what importing it would run). A field
    is named the same whichever form the tree gives it in (``algorithm`` and ``algorithm.name`` are one field;
    a list's items are ``model.callbacks[0]``, ...)."""
    found: dict[str, str] = {}
    for key in PLUGIN_KEYS:
        node: Any = tree
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        items = node if isinstance(node, list) else [node]
        for i, item in enumerate(items):
            spec = item.get("class_path") if isinstance(item, dict) else item
            if isinstance(spec, str) and is_plugin(spec):
                field = SHORT_FORMS.get(key, key)
                found[f"{field}[{i}]" if isinstance(node, list) else field] = spec
    return found


def names_code(cfg: Any) -> bool:
    """Whether a validated config (a RunConfig) names plug-ins: resuming its run then needs --trust-plugins."""
    return bool(plugin_settings(cfg.model_dump()))


def imported_files(tree: dict[str, Any]) -> tuple[tuple[str, str, str], ...]:
    """(module, file, digest of its source) of fedsim and of each plug-in module ``tree`` names, as this process
    imported them: what the workers of a run must import too (:func:`other_code`)."""
    names = ["fedsim", *sorted({spec.partition(":")[0] for spec in plugin_settings(tree).values()})]
    return tuple((name, file, _source_digest(file)) for name in names if (file := _file_of(name)))


def _file_of(module_name: str) -> str:
    file = getattr(sys.modules.get(module_name), "__file__", None)
    return str(Path(file).resolve()) if file else ""


def _source_digest(file: str) -> str:
    """A module's source, or a package's (every .py file under its folder, by relative name): the same code at
    another path (a job's working_dir unpacked on each node) has the same digest."""
    path = Path(file)
    files = sorted(path.parent.rglob("*.py")) if path.name == "__init__.py" else [path]
    digest = hashlib.sha256()
    for one in files:
        digest.update(str(one.relative_to(path.parent)).encode() + b"\0" + one.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def other_code(expected: tuple[tuple[str, str, str], ...]) -> str | None:
    """One line naming the first module this process imported other code for than ``expected`` (the driver's),
    or None. A module not imported here is not compared; the same source at another path is the same code."""
    for name, there, source in expected:
        here = _file_of(name)
        if here and _source_digest(here) != source:
            return (f"{name}: this worker imported {here}, the driver {there} (other code); Ray puts the folder fedsim "
                    "was started from ahead of PYTHONPATH on its workers: run fedsim from another folder, or install "
                    "one copy")
    return None
