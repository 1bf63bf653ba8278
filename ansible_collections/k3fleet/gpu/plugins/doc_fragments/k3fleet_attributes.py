# -*- coding: utf-8 -*-
# Copyright: k3fleet contributors
# Apache-2.0 (see pyproject.toml)
"""Module attributes documented once (the way community.docker's doc_fragments/attributes.py does).

``k3fleet.gpu.k3fleet_attributes.read_only`` is what every k3fleet_*_info module declares: it reads a
node and changes nothing. A module's own ``attributes`` entries extend or override these.
"""

from __future__ import annotations


class ModuleDocFragment(object):
    DOCUMENTATION = r"""
options: {}
"""

    READ_ONLY = r"""
options: {}
attributes:
  check_mode:
    description: Runs unchanged in check mode; it only reads.
    support: full
  diff_mode:
    description: Nothing is changed, so there is no diff.
    support: none
  idempotent:
    description: Reading the same node twice gives the same report and never a change.
    support: full
"""
