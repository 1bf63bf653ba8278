#!/usr/bin/python
# -*- coding: utf-8 -*-
# Apache-2.0 (see the project's pyproject.toml)
# Ansible module layout: documentation before the imports, node-side Python idioms.
# ruff: noqa: E402, UP001, UP009, UP010, UP031

from __future__ import annotations

DOCUMENTATION = r"""
---
module: k3fleet_slurm_node
short_description: Lease and drain a Slurm node for a k3fleet change, wait for its jobs, give back only its lease
description:
  - The drain reason is the change's lease, given whole in I(reason); its first word is C(k3fleet:<change_id>)
    (docs/change-night.md "Lease").
  - With I(state=drained), drains the node with that reason, reads it back after I(settle) seconds (Slurm has no
    compare-and-set, so of two controllers racing for a node only the one whose reason stayed goes on), then waits
    until no job runs on it (C(scontrol show node) and C(squeue) polled every I(poll_interval) seconds, up to
    I(wait_timeout)). Running jobs are never cancelled unless I(force=true).
  - A node whose reason is another change's lease is C(held) by that change and left exactly as it is, also when
    that change takes it while this one waits. A node drained by someone else (an operator, a health check) is
    leased on top of their reason, which the lease keeps at its end (C(adopt)); C(drained_by_us) stays false so the
    caller never returns it to service. A down or failed node without a drain is left as it is (C(other)).
  - With I(state=resumed), resumes the node only when its reason is this change's lease (the LBNL NHC
    node-mark-online rule); a lease that adopted someone's drain puts their reason back and leaves the node drained
    (C(restore)). A node drained by anyone else stays drained.
  - With I(state=query), only reads the node (the scheduler part of a pre-change snapshot).
  - The Slurm client commands run on the host executing the module, the node itself or a login or controller
    host through C(delegate_to). I(slurm_conf) points them at a cluster's C(slurm.conf).
version_added: "0.1.0"
author:
  - k3fleet maintainers
options:
  node:
    description: Slurm NodeName of the node.
    type: str
    required: true
  state:
    description:
      - C(drained) lease and drain (or confirm this change's lease) and wait for running jobs to end.
      - C(resumed) give the node back if, and only if, this change holds its lease.
      - C(query) read the node's state, drain reason and running jobs; never changes anything.
      - C(validated) put the validated marker C(k3fleet.io/validated=<driver> (<change_id>)) first in the node's
        Comment (anyone else's comment is kept after C(|)); C(unvalidated) take it out again (a rollback).
    type: str
    choices: [drained, resumed, query, validated, unvalidated]
    default: drained
  driver:
    description: The driver version the node was verified on. Required with I(state=validated).
    type: str
  change_id:
    description:
      - The change id; the lease starts with C(k3fleet:<change_id>). Letters, digits, C(.), C(_) and C(-), at most
        64 characters.
      - Required unless I(state=query); with C(query) it decides the reported I(owner).
    type: str
  reason:
    description:
      - The lease, whole, as the controller wrote it, for example C(k3fleet:CHG-1042 alice - NVIDIA driver change)
        with the change id after C(k3fleet:). Required with I(state=drained).
    type: str
  wait:
    description: Wait for running jobs to end after draining. Without it the module returns once the drain is set.
    type: bool
    default: true
  wait_timeout:
    description:
      - Seconds to wait for running jobs. When they still run afterwards the module fails and the drain stays
        in place, unless I(force=true).
    type: int
    default: 3600
  poll_interval:
    description: Seconds between two reads of the node while waiting.
    type: float
    default: 10
  settle:
    description: Seconds between setting the lease and reading it back to confirm that no other change took the node.
    type: float
    default: 2
  force:
    description:
      - Cancel (C(scancel)) the jobs still running on the node when I(wait_timeout) has passed, then wait up to
        I(cancel_grace) seconds for them to end. A multi-node job is cancelled as a whole.
      - Never the default. With I(wait_timeout=0) the jobs are cancelled at once.
    type: bool
    default: false
  cancel_grace:
    description: Seconds to wait for cancelled jobs to end (I(force=true) only).
    type: int
    default: 120
  query:
    description: How the node is read. C(scontrol) asks for this node only; C(sinfo_json) reads C(sinfo --json).
    type: str
    choices: [scontrol, sinfo_json]
    default: scontrol
  slurm_conf:
    description: Path of the C(slurm.conf) the Slurm client commands use (exported as C(SLURM_CONF)).
    type: path
  path:
    description: Search path for C(scontrol), C(squeue) and C(scancel). Defaults to the module's own C(PATH).
    type: str
  timeout:
    description:
      - Seconds before one Slurm client command is killed. A client without a reachable C(slurm.conf)
        retries for a minute before it gives up, so this bounds each read.
    type: float
    default: 20
attributes:
  check_mode:
    support: full
    description: Reads the node and reports the drain or resume it would do; changes nothing and does not wait.
  diff_mode:
    support: full
    description: Before and after node state and drain reason.
  idempotent:
    support: full
    description: A node already drained for this change, or not drained, is reported unchanged.
notes:
  - Tested against Slurm 22.05 (Debian slurm-wlm); C(sinfo --json) of 23.02 and later (state lists) is also read.
"""

EXAMPLES = r"""
- name: Lease and drain the node for change CHG-1042, waiting up to an hour for its jobs
  k3fleet.gpu.k3fleet_slurm_node:
    node: gpu017
    state: drained
    change_id: CHG-1042
    reason: "k3fleet:CHG-1042 alice: NVIDIA driver change"
    wait_timeout: 3600
  delegate_to: slurm-login01
  register: drain

- name: Return the node to service only if this change holds its lease
  k3fleet.gpu.k3fleet_slurm_node:
    node: gpu017
    state: resumed
    change_id: CHG-1042
  delegate_to: slurm-login01
"""

RETURN = r"""
actions:
  description: What was done (or would be done in check mode), one readable line each.
  returned: always
  type: list
  elements: str
  sample: ["scontrol update nodename=gpu017 state=drain reason='k3fleet:CHG-1042 alice: NVIDIA driver change'",
           "waited 42s for 1 running job(s) to end"]
k3fleet:
  description: The result the k3fleet controller reads.
  returned: always
  type: dict
  contains:
    node:
      description: The Slurm NodeName.
      returned: always
      type: str
      sample: gpu017
    decision:
      description:
        - C(drain) (leased and drained now), C(ours) (already leased by this change), C(adopt) (drained by someone
          else, leased on top of their reason), C(held) (another change's lease, left alone), C(other) (down or
          failed without a drain, left alone), C(resume), C(restore), C(not_drained), C(not_ours), C(query),
          C(validated) or C(unvalidated).
      returned: always
      type: str
      sample: drain
    marker:
      description: With I(state=validated), the marker put first in the node's Comment.
      returned: when state is validated
      type: str
      sample: k3fleet.io/validated=580.95.05 (CHG-1042)
    owner:
      description: Who holds the node's current drain reason, C(ours), C(k3fleet) (another change), C(other), or null.
      returned: always
      type: str
      sample: ours
    holder:
      description: The change id holding the node when it is another change's (C(held)), else null.
      returned: always
      type: str
      sample: null
    drained_by_us:
      description: True when this change took the node out of service, so that it may return it later.
      returned: always
      type: bool
      sample: true
    leased:
      description: True when the node carries this change's lease (C(drain), C(ours), C(adopt)).
      returned: always
      type: bool
      sample: true
    reason:
      description: The lease this change uses.
      returned: when reason is given
      type: str
      sample: "k3fleet:CHG-1042 alice: NVIDIA driver change"
    before:
      description: Node status before the module acted (state, flags, reason, reason_user, reason_time, jobs).
      returned: always
      type: dict
      sample: {"state": "mixed", "drain": false, "reason": null, "jobs_running": 1, "job_ids": ["31"]}
    after:
      description: Node status when the module returned (predicted in check mode).
      returned: always
      type: dict
      sample: {"state": "drained", "drain": true, "reason": "k3fleet:CHG-1042 alice: NVIDIA driver change"}
    waited_s:
      description: Seconds spent waiting for running jobs.
      returned: always
      type: float
      sample: 42.1
    jobs_cancelled:
      description: Job ids cancelled because I(force=true).
      returned: always
      type: list
      elements: str
      sample: []
    commands:
      description: Every Slurm command run, with exit status and duration.
      returned: always
      type: list
      elements: dict
      sample: [{"argv": ["scontrol", "show", "node", "gpu017", "--oneliner"], "rc": 0, "error": null,
                "stderr": "", "duration": 0.02}]
"""

import os
import time
from collections.abc import Callable
from typing import Any, NoReturn

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.k3fleet.gpu.plugins.module_utils import k3fleet_load

# Before any other module_util: from an AnsiballZ payload each one then compiles once, not twice.
k3fleet_load.install()

from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_cmd import NodeReader
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_lease import (
    adopted_text,
    check_lease,
    lease_holder,
    lease_id,
    lease_owner,
    previous_reason,
)
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_module import RESULT_KEY
from ansible_collections.k3fleet.gpu.plugins.module_utils.k3fleet_slurm import (
    SlurmError,
    SlurmNode,
    drain_complete,
    plan_drain,
    plan_resume,
    strip_marker,
    validated_marker,
    with_marker,
)

# After `state=resume` slurmctld may show IDLE+NOT_RESPONDING for a ping or two; DRAIN goes at once.
RESUME_SETTLE_S = 10.0


def _show(status: dict[str, Any] | None) -> str:
    if not status:
        return "(unknown)\n"
    return "state: %s\nreason: %s\njobs_running: %s\n" % (
        status.get("raw_state") or status.get("state"), status.get("reason") or "", status.get("jobs_running"))


def _quote(text: str | None) -> str:
    return "'%s'" % (text or "").replace("'", "'\\''")


class Run:
    """One module invocation: the node, what it did, and how to report it."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        p = module.params
        env = dict(os.environ)
        if p["slurm_conf"]:
            env["SLURM_CONF"] = p["slurm_conf"]
        self.reader = NodeReader(path=p["path"], timeout=p["timeout"], env=env)
        self.slurm = SlurmNode(self.reader, p["node"], query=p["query"])
        self.change_id = p["change_id"]
        # True once this run wrote the node's reason: a lease lost afterwards is still a change made.
        self.wrote = False
        self.actions: list[str] = []
        self.result: dict[str, Any] = {
            "node": p["node"], "decision": None, "owner": None, "holder": None, "drained_by_us": False,
            "leased": False, "before": None, "after": None, "waited_s": 0.0, "jobs_cancelled": [],
            "commands": self.reader.commands,
        }
        if p["reason"]:
            self.result["reason"] = p["reason"]

    def fail(self, msg: str) -> NoReturn:
        self.module.fail_json(msg=msg, actions=self.actions, **{RESULT_KEY: self.result})
        # fail_json exits (ansible-core types it NoReturn; its package ships no type information).
        raise AssertionError("fail_json returned")

    def read(self, with_jobs: bool = True) -> dict[str, Any]:
        try:
            return self.slurm.status(with_jobs=with_jobs)
        except SlurmError as exc:
            self.fail(str(exc))

    def act(self, fn: Callable[..., object], *args: object) -> None:
        try:
            fn(*args)
        except SlurmError as exc:
            self.fail(str(exc))

    def done(self, changed: bool) -> NoReturn:
        r = self.result
        r["owner"] = lease_owner((r["after"] or {}).get("reason"), self.change_id)
        kwargs = {"changed": changed, "actions": self.actions, RESULT_KEY: r}
        if self.module._diff:
            kwargs["diff"] = {"before_header": "slurm node %s" % r["node"], "after_header": "slurm node %s" % r["node"],
                              "before": _show(r["before"]), "after": _show(r["after"])}
        self.module.exit_json(**kwargs)
        raise AssertionError("exit_json returned")

    def held(self, status: dict[str, Any], why: str) -> NoReturn:
        """Another change holds the node: report it and touch nothing more."""
        r = self.result
        r.update(decision="held", holder=lease_holder(status["reason"]), drained_by_us=False, leased=False,
                 after=status)
        self.actions.append("left as it is: %s (reason: %s)" % (why, status["reason"]))
        self.done(self.wrote)

    # -- drained ---------------------------------------------------------
    def drain(self) -> NoReturn:
        p, r = self.module.params, self.result
        before = self.read()
        r["before"] = before
        decision = plan_drain(before, self.change_id)
        r["decision"] = decision
        r["drained_by_us"] = decision in ("drain", "ours")
        r["leased"] = decision in ("drain", "ours", "adopt")
        if decision == "held":
            self.held(before, "held by change %s" % lease_holder(before["reason"]))
        changed = decision in ("drain", "adopt")
        lease = p["reason"] if decision != "adopt" else adopted_text(p["reason"], before["reason"])
        if changed:
            self.actions.append("scontrol update nodename=%s state=drain reason=%s" % (p["node"], _quote(lease)))
        elif decision == "other":
            self.actions.append("left as it is: %s by someone else (reason: %s)" % (
                before["state"], before["reason"] or "none"))
        if self.module.check_mode:
            after = dict(before)
            if changed:
                after.update(drain=True, unavailable=True, reason=lease,
                             state=before["state"] if decision == "adopt" else (
                                 "draining" if before["jobs_running"] else "drained"))
            if before["jobs_running"] and p["wait"]:
                self.actions.append("would wait up to %ss for %d running job(s): %s" % (
                    p["wait_timeout"], before["jobs_running"], ",".join(before["job_ids"] or [])))
            r["after"] = after
            self.done(changed)
        if changed:
            self.act(self.slurm.drain, lease)
            self.wrote = True
            self.confirm()
        r["after"] = self.wait() if p["wait"] else self.read()
        self.done(changed)

    def confirm(self) -> dict[str, Any]:
        """Read the lease back once the other controllers' writes would have landed."""
        time.sleep(max(0.0, self.module.params["settle"]))
        status = self.read(with_jobs=False)
        if lease_owner(status["reason"], self.change_id) == "k3fleet":
            self.held(status, "another change took the node at the same moment (held by change %s)"
                      % lease_holder(status["reason"]))
        return status

    def wait(self) -> dict[str, Any]:
        p, r = self.module.params, self.result
        started = time.time()
        deadline = started + max(0, p["wait_timeout"])
        cancelled = False
        while True:
            status = self.read()
            r["after"] = status
            r["waited_s"] = round(time.time() - started, 1)
            if not status["unavailable"]:
                self.fail("node %s was returned to service (state %s) while k3fleet waited for its jobs; "
                          "someone resumed it: drain it again or find out who" % (p["node"], status["state"]))
            owner = lease_owner(status["reason"], self.change_id)
            if owner == "k3fleet":
                self.held(status, "another change took the node while this one waited for its jobs (held by "
                                  "change %s)" % lease_holder(status["reason"]))
            if r["leased"] and owner != "ours":
                self.fail("node %s: the drain reason changed to %r while k3fleet waited for its jobs; someone "
                          "else took the node: find out who before changing it" % (p["node"], status["reason"]))
            if drain_complete(status):
                if r["waited_s"] >= 1:
                    self.actions.append("waited %ds for running jobs to end" % r["waited_s"])
                return status
            now = time.time()
            if now >= deadline:
                if p["force"] and not cancelled:
                    ids = status["job_ids"] or []
                    self.actions.append("scancel %s (force: still running after %ss)" % (
                        " ".join(ids), p["wait_timeout"]))
                    self.act(self.slurm.cancel, ids)
                    r["jobs_cancelled"] = ids
                    cancelled = True
                    deadline = now + max(0, p["cancel_grace"])
                    continue
                what = "after cancelling them, %ss grace" % p["cancel_grace"] if cancelled else (
                    "after %ss; the drain stays in place. Wait longer (wait_timeout) or cancel them yourself "
                    "(force=true cancels them)" % p["wait_timeout"])
                self.fail("node %s still runs %s job(s) (%s, state %s) %s" % (
                    p["node"], status["jobs_running"], ",".join(status["job_ids"] or []) or "ids unknown",
                    status["state"], what))
            time.sleep(max(0.0, min(p["poll_interval"], deadline - now)))

    # -- resumed ---------------------------------------------------------
    def resume(self) -> NoReturn:
        p, r = self.module.params, self.result
        before = self.read(with_jobs=False)
        r["before"] = before
        decision = plan_resume(before, self.change_id)
        r["decision"] = decision
        r["drained_by_us"] = decision == "resume"
        r["holder"] = lease_holder(before["reason"]) if lease_owner(before["reason"], self.change_id) == "k3fleet" \
            else None
        if decision == "not_drained":
            r["after"] = before
            self.done(False)
        if decision == "not_ours":
            self.actions.append("left drained: the reason is not this change's (%s)" % (before["reason"] or "none"))
            r["after"] = before
            self.done(False)
        if decision == "restore":
            previous = previous_reason(before["reason"])
            self.actions.append("scontrol update nodename=%s state=drain reason=%s (the drain was someone else's: "
                                "their reason is put back, the node stays drained)" % (p["node"], _quote(previous)))
            if self.module.check_mode:
                r["after"] = dict(before, reason=previous)
                self.done(True)
            self.act(self.slurm.drain, previous)
            r["after"] = self.read(with_jobs=False)
            self.done(True)
        self.actions.append("scontrol update nodename=%s state=resume" % p["node"])
        if self.module.check_mode:
            after = dict(before)
            after.update(drain=False, unavailable=False, reason=None, state="idle")
            r["after"] = after
            self.done(True)
        self.act(self.slurm.resume)
        settle = time.time() + RESUME_SETTLE_S
        while True:
            status = self.read(with_jobs=False)
            if not status["drain"] or time.time() >= settle:
                break
            time.sleep(1.0)
        r["after"] = status
        if status["drain"]:
            self.fail("node %s still has DRAIN (state %s) %ds after scontrol resumed it" % (
                p["node"], status["raw_state"], RESUME_SETTLE_S))
        self.done(True)

    # -- validated / unvalidated ------------------------------------------
    def mark(self, validated: bool) -> NoReturn:
        p, r = self.module.params, self.result
        before = self.read(with_jobs=False)
        r["before"] = before
        current = before.get("comment") or ""
        wanted = with_marker(current, validated_marker(p["driver"], self.change_id)) if validated else \
            strip_marker(current)
        r["decision"] = "validated" if validated else "unvalidated"
        r["marker"] = validated_marker(p["driver"], self.change_id) if validated else None
        if wanted == current:
            r["after"] = before
            self.done(False)
        self.actions.append("scontrol update nodename=%s comment=%s" % (p["node"], _quote(wanted)))
        if self.module.check_mode:
            r["after"] = dict(before, comment=wanted or None)
            self.done(True)
        self.act(self.slurm.set_comment, wanted)
        r["after"] = self.read(with_jobs=False)
        if (r["after"].get("comment") or "") != wanted:
            self.fail("node %s: the comment reads %r after setting it to %r" % (
                p["node"], r["after"].get("comment"), wanted))
        self.done(True)

    def query(self) -> NoReturn:
        status = self.read()
        owner = lease_owner(status["reason"], self.change_id)
        self.result.update(decision="query", before=status, after=status,
                           holder=lease_holder(status["reason"]) if owner == "k3fleet" else None,
                           leased=owner == "ours",
                           drained_by_us=plan_resume(status, self.change_id) == "resume" if self.change_id else False)
        self.done(False)


ARGUMENT_SPEC = dict(
    node=dict(type="str", required=True),
    state=dict(type="str", default="drained", choices=["drained", "resumed", "query", "validated", "unvalidated"]),
    driver=dict(type="str"),
    change_id=dict(type="str"),
    reason=dict(type="str"),
    wait=dict(type="bool", default=True),
    wait_timeout=dict(type="int", default=3600),
    poll_interval=dict(type="float", default=10.0),
    settle=dict(type="float", default=2.0),
    force=dict(type="bool", default=False),
    cancel_grace=dict(type="int", default=120),
    query=dict(type="str", default="scontrol", choices=["scontrol", "sinfo_json"]),
    slurm_conf=dict(type="path"),
    path=dict(type="str"),
    timeout=dict(type="float", default=20.0),
)


def main() -> None:
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        required_if=[("state", "drained", ("change_id", "reason")), ("state", "resumed", ("change_id",)),
                     ("state", "validated", ("change_id", "driver"))],
        supports_check_mode=True,
    )
    p = module.params
    node = (p["node"] or "").strip()
    if not node or any(ch.isspace() or ch in ",[]" for ch in node):
        module.fail_json(msg="node must be one Slurm NodeName, got %r" % p["node"])
    if p["change_id"] is not None:
        why = check_lease(p["change_id"], p["reason"] if p["reason"] is not None else lease_id(p["change_id"]))
        if why:
            module.fail_json(msg=why)
    if p["poll_interval"] <= 0:
        module.fail_json(msg="poll_interval must be positive, got %s" % p["poll_interval"])
    if p["settle"] < 0:
        module.fail_json(msg="settle must be 0 or more, got %s" % p["settle"])
    run = Run(module)
    if p["state"] == "drained":
        run.drain()
    elif p["state"] == "resumed":
        run.resume()
    elif p["state"] in ("validated", "unvalidated"):
        run.mark(p["state"] == "validated")
    else:
        run.query()


if __name__ == "__main__":
    main()
