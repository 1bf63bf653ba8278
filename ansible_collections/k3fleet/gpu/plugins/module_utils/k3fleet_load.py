# -*- coding: utf-8 -*-
# Stdlib only: shipped to nodes inside the AnsiballZ payload.
"""Import this collection's module_utils from an AnsiballZ payload with one compile each.

AnsiballZ ships module_utils as sources in a zip and Python imports them with zipimport, which
compiles a source module twice: once while the import system names the module's file for its
spec (``zipimporter.get_filename``), once to run it (``get_code``). That is python/cpython#141276,
open upstream; counted here on CPython 3.8 to 3.13, every release since zipimport became Python
code. A node has no bytecode cache for the payload, so every module run paid both compiles of
every module_util it imported.

Every k3fleet module imports this module first and calls :func:`install` before importing any
other module_util. When this module itself came from a zip, that puts a finder for its sibling
module_utils first on ``sys.meta_path``: it names the file without compiling and compiles the
source once. Anywhere else (the controller, tests, ansible-test's import check, an exploded
payload) it installs nothing. Packages, names outside this package and anything the payload does
not hold as source are left to the normal import system.

:func:`install_payload` covers the whole payload: every module and package the zip holds as source
(Ansible's own module_utils, the collections', the module itself). A module can only call it after
AnsiballZ's wrapper has imported Ansible's module_utils, so the collection's action plugins
(``plugins/plugin_utils/k3fleet_action.py``) insert the call into the wrapper, right before it
imports them. That finder stands where zipimport would answer: before the path finder on
``sys.meta_path``, and only for names whose search path (``sys.path`` for top-level names, the
parent's ``__path__`` otherwise) starts with this payload; anything else is left as it was.
"""

from __future__ import annotations

import os
import sys
import zipimport
from collections.abc import Iterator, Sequence
from importlib.machinery import ModuleSpec, PathFinder, SourceFileLoader
from importlib.util import spec_from_loader
from types import ModuleType
from typing import Any

PACKAGE = __name__.rpartition(".")[0]


class PayloadSourceLoader(SourceFileLoader):
    """A source module inside the payload: its bytes from the zip, compiled once, no bytecode cache."""

    def __init__(self, fullname: str, path: str, archive: zipimport.zipimporter, data: bytes | None = None) -> None:
        super(PayloadSourceLoader, self).__init__(fullname, path)
        self.importer = archive
        # The zip's path, as a zipimporter names it: importlib.resources on Python 3.9 reads a
        # package's files from ``loader.archive``.
        self.archive = archive.archive
        # The source as the finder read it: the import reads it once.
        self._data = data

    def get_data(self, path: str) -> bytes:
        data, self._data = self._data, None
        if data is not None and path == self.path:
            return data
        return self.importer.get_data(path)

    def path_stats(self, path: str) -> Any:
        # No bytecode beside a payload's sources: SourceLoader then compiles the source and
        # writes nothing back.
        raise OSError("%s: no bytecode cache inside the payload" % path)

    def _zipimporter(self) -> zipimport.zipimporter:
        # The zipimporter that would have loaded this module: zipimport names a module by its last
        # part, so it is the one of the directory that holds the module (or the package).
        where = os.path.dirname(self.path)
        if os.path.basename(self.path) == "__init__.py":
            where = os.path.dirname(where)
        return zipimport.zipimporter(where)

    def get_source(self, fullname: str) -> str | None:
        # The source text as zipimport gives it (tracebacks, inspect), not re-decoded by SourceLoader.
        return self._zipimporter().get_source(fullname)

    # zipimporter's signature (it is what this calls), narrower than SourceFileLoader's optional name.
    def get_resource_reader(self, module: str) -> Any:  # type: ignore[override]
        # A package's resources as zipimport reads them, from the zip (a file loader's reader would
        # look for a directory named after the zip).
        try:
            return self._zipimporter().get_resource_reader(module)
        except (zipimport.ZipImportError, AttributeError):
            return None


class PayloadFinder:
    """Finds the modules of ``PACKAGE`` that ``archive`` (the package's zipimporter) holds as sources."""

    def __init__(self, archive: zipimport.zipimporter) -> None:
        self.archive = archive
        self.base = archive.archive + "/" + archive.prefix

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        parent, dot, name = fullname.rpartition(".")
        if not dot or parent != PACKAGE:
            return None
        try:
            if self.archive.is_package(name):
                return None
        except zipimport.ZipImportError:
            return None
        source = self.base + name + ".py"
        try:
            data = self.archive.get_data(source)
        except (IOError, OSError):
            # Bytecode only, or not in the payload: zipimport decides.
            return None
        return spec_from_loader(fullname, PayloadSourceLoader(fullname, source, self.archive, data))


class WholePayloadFinder(PayloadFinder):
    """Finds every module and package that the payload ``archive`` (the zip's root zipimporter) holds as source.

    It answers as zipimport would from the same zip, with one compile: a package from its
    ``__init__.py`` (its ``__path__`` the package's directory in the zip, as zipimport sets it), a
    module from its ``.py``. Where zipimport would take bytecode first (a ``.pyc`` of the same name),
    where the zip does not come first on the search path, or on any error, it answers nothing and
    the import system goes on as without it.
    """

    def __init__(self, archive: zipimport.zipimporter) -> None:
        self.archive = archive
        self.root = archive.archive
        self.base = self.root + os.sep

    def _prefixes(self, path: Sequence[str] | None) -> Iterator[str]:
        # The zip's directories to look in, in search-path order, up to the first entry that is not
        # this zip (from there on the path finder decides, as it would without this finder).
        for entry in sys.path if path is None else path:
            if not isinstance(entry, str):
                return
            if entry == self.root:
                yield ""
            elif entry.startswith(self.base):
                yield entry[len(self.base):].replace(os.sep, "/") + "/"
            else:
                return

    def _has(self, name: str) -> bool:
        try:
            self.archive.get_data(self.base + name)
        except (IOError, OSError):
            return False
        return True

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        try:
            return self._find(fullname, path)
        except Exception:  # never a failed import because of this finder: zipimport answers as it did
            return None

    def _find(self, fullname: str, path: Sequence[str] | None) -> ModuleSpec | None:
        tail = fullname.rpartition(".")[2]
        for prefix in self._prefixes(path):
            stem = prefix + tail
            # zipimport's order: the package's bytecode, its source, the module's bytecode, its source.
            for name in (stem + "/__init__", stem):
                if self._has(name + ".pyc"):
                    return None
                source = self.base + name + ".py"
                try:
                    data = self.archive.get_data(source)
                except (IOError, OSError):
                    continue
                return spec_from_loader(fullname, PayloadSourceLoader(fullname, source, self.archive, data))
            # A directory without __init__ (a namespace portion) or nothing here: zipimport decides.
            return None
        return None


def installed() -> PayloadFinder | None:
    """The finder this module installed, or None."""
    for finder in sys.meta_path:
        if isinstance(finder, PayloadFinder):
            return finder
    return None


def install() -> PayloadFinder | None:
    """Install the finder when this module was imported from a zip; returns it (or None)."""
    loader = globals().get("__loader__")
    if not isinstance(loader, zipimport.zipimporter):
        return None
    finder = installed()
    if finder is None:
        finder = PayloadFinder(loader)
        sys.meta_path.insert(0, finder)
    return finder


def install_payload() -> PayloadFinder | None:
    """Install the whole-payload finder when this module was imported from a zip; returns it (or None).

    A finder of this package already installed by :func:`install` stays (it answers the same way for
    its names); :func:`install` after this one finds this one and installs nothing more.
    """
    loader = globals().get("__loader__")
    if not isinstance(loader, zipimport.zipimporter):
        return None
    for finder in sys.meta_path:
        if isinstance(finder, WholePayloadFinder):
            return finder
    finder = WholePayloadFinder(zipimport.zipimporter(loader.archive))
    # Where zipimport answers: in the path finder, after the built-in and frozen modules.
    index = len(sys.meta_path)
    for position, entry in enumerate(sys.meta_path):
        if entry is PathFinder:
            index = position
            break
    sys.meta_path.insert(index, finder)
    return finder
