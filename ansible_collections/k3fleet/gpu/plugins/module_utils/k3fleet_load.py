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
"""

from __future__ import absolute_import, division, print_function

import sys
import zipimport
from importlib.machinery import SourceFileLoader
from importlib.util import spec_from_loader

__metaclass__ = type

PACKAGE = __name__.rpartition(".")[0]


class PayloadSourceLoader(SourceFileLoader):
    """A source module inside the payload: its bytes from the zip, compiled once, no bytecode cache."""

    def __init__(self, fullname, path, archive, data=None):
        super(PayloadSourceLoader, self).__init__(fullname, path)
        self.archive = archive
        # The source as the finder read it: the import reads it once.
        self._data = data

    def get_data(self, path):
        data, self._data = self._data, None
        if data is not None and path == self.path:
            return data
        return self.archive.get_data(path)

    def path_stats(self, path):
        # No bytecode beside a payload's sources: SourceLoader then compiles the source and
        # writes nothing back.
        raise OSError("%s: no bytecode cache inside the payload" % path)


class PayloadFinder:
    """Finds the modules of ``PACKAGE`` that ``archive`` (the package's zipimporter) holds as sources."""

    def __init__(self, archive):
        self.archive = archive
        self.base = archive.archive + "/" + archive.prefix

    def find_spec(self, fullname, path=None, target=None):
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


def installed():
    """The finder this module installed, or None."""
    for finder in sys.meta_path:
        if isinstance(finder, PayloadFinder):
            return finder
    return None


def install():
    """Install the finder when this module was imported from a zip; returns it (or None)."""
    loader = globals().get("__loader__")
    if not isinstance(loader, zipimport.zipimporter):
        return None
    finder = installed()
    if finder is None:
        finder = PayloadFinder(loader)
        sys.meta_path.insert(0, finder)
    return finder
