#!/usr/bin/python
# -*- coding: utf-8 -*-
# Apache-2.0 (see the project's pyproject.toml)
# Ansible module layout: documentation before the imports, node-side Python idioms.
# ruff: noqa: E402, UP001, UP009, UP010, UP031

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: k3fleet_slurm_node
short_description: Drain a Slurm node for a k3fleet change, wait for its jobs, and resume only what k3fleet drained
description:
  - With I(state=drained), drains the node with the reason C(k3fleet:<change_id> [operator:] reason), then waits
    until no job runs on it (C(scontrol show node) and C(squeue) polled every I(poll_interval) seconds, up to
    I(wait_timeout)). Running jobs are never cancelled unless I(force=true).
  - A node that is already drained, down or failed with a reason that is not this change's (an operator, a
    health check, Slurm itself, another k3fleet change) is left exactly as it is; the result says
    C(drained_by_us=false) so the caller never returns it to service.
  - With I(state=resumed), resumes the node only when its drain reason starts with C(k3fleet:<change_id>)
    (the LBNL NHC node-mark-online rule). A node drained by anyone else stays drained.
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
      - C(drained) drain (or confirm this change's drain) and wait for running jobs to end.
      - C(resumed) resume the node if, and only if, this change drained it.
      - C(query) read the node's state, drain reason and running jobs; never changes anything.
    type: str
    choices: [drained, resumed, query]
    default: drained
  change_id:
    description:
      - The change id; the drain reason starts with C(k3fleet:<change_id>), which is how a later resume knows
        the drain is ours. Letters, digits, C(.), C(_) and C(-), at most 64 characters.
      - Required unless I(state=query); with C(query) it decides the reported I(owner).
    type: str
  operator:
    description: Who runs the change; written into the drain reason after the prefix.
    type: str
  reason:
    description: Free text after the prefix (and operator) in the drain reason.
    type: str
    default: NVIDIA driver change
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
- name: Drain the node for change CHG-1042, waiting up to an hour for its jobs
  k3fleet_slurm_node:
    node: gpu017
    state: drained
    change_id: CHG-1042
    operator: alice
    wait_timeout: 3600
  delegate_to: slurm-login01
  register: drain

- name: Return the node to service only if this change drained it
  k3fleet_slurm_node:
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
        - C(drain) (drained now), C(ours) (already drained for this change), C(other) (drained, down or failed
          by someone else, left alone), C(resume), C(not_drained), C(not_ours), or C(query).
      returned: always
      type: str
      sample: drain
    owner:
      description: Who holds the node's current drain reason, C(ours), C(k3fleet) (another change), C(other), or null.
      returned: always
      type: str
      sample: ours
    drained_by_us:
      description: True when the node is drained for this change, so that this change may resume it later.
      returned: always
      type: bool
      sample: true
    reason:
      description: The drain reason this change uses.
      returned: when change_id is given
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

from ansible.module_utils.basic import AnsibleModule

try:
    from ansible.module_utils.k3fleet_cmd import NodeReader
    from ansible.module_utils.k3fleet_module import RESULT_KEY
    from ansible.module_utils.k3fleet_slurm import (
        SlurmError,
        SlurmNode,
        drain_complete,
        drain_reason,
        plan_drain,
        plan_resume,
        reason_owner,
        valid_change_id,
    )
except ImportError:  # imported from the controller package (unit tests)
    from k3fleet.ansible.module_utils.k3fleet_cmd import NodeReader
    from k3fleet.ansible.module_utils.k3fleet_module import RESULT_KEY
    from k3fleet.ansible.module_utils.k3fleet_slurm import (
        SlurmError,
        SlurmNode,
        drain_complete,
        drain_reason,
        plan_drain,
        plan_resume,
        reason_owner,
        valid_change_id,
    )

# After `state=resume` slurmctld may show IDLE+NOT_RESPONDING for a ping or two; DRAIN goes at once.
RESUME_SETTLE_S = 10.0


def _show(status):
    if not status:
        return "(unknown)\n"
    return "state: %s\nreason: %s\njobs_running: %s\n" % (
        status.get("raw_state") or status.get("state"), status.get("reason") or "", status.get("jobs_running"))


def _quote(text):
    return "'%s'" % text.replace("'", "'\\''")


class Run:
    """One module invocation: the node, what it did, and how to report it."""

    def __init__(self, module):
        self.module = module
        p = module.params
        env = dict(os.environ)
        if p["slurm_conf"]:
            env["SLURM_CONF"] = p["slurm_conf"]
        self.reader = NodeReader(path=p["path"], timeout=p["timeout"], env=env)
        self.slurm = SlurmNode(self.reader, p["node"], query=p["query"])
        self.change_id = p["change_id"]
        self.actions = []
        self.result = {
            "node": p["node"], "decision": None, "owner": None, "drained_by_us": False,
            "before": None, "after": None, "waited_s": 0.0, "jobs_cancelled": [],
            "commands": self.reader.commands,
        }
        if self.change_id:
            self.result["reason"] = drain_reason(self.change_id, p["reason"], p["operator"])

    def fail(self, msg):
        self.module.fail_json(msg=msg, actions=self.actions, **{RESULT_KEY: self.result})

    def read(self, with_jobs=True):
        try:
            return self.slurm.status(with_jobs=with_jobs)
        except SlurmError as exc:
            self.fail(str(exc))

    def act(self, fn, *args):
        try:
            fn(*args)
        except SlurmError as exc:
            self.fail(str(exc))

    def done(self, changed):
        r = self.result
        r["owner"] = reason_owner((r["after"] or {}).get("reason"), self.change_id)
        kwargs = {"changed": changed, "actions": self.actions, RESULT_KEY: r}
        if self.module._diff:
            kwargs["diff"] = {"before_header": "slurm node %s" % r["node"], "after_header": "slurm node %s" % r["node"],
                              "before": _show(r["before"]), "after": _show(r["after"])}
        self.module.exit_json(**kwargs)

    # -- drained ---------------------------------------------------------
    def drain(self):
        p, r = self.module.params, self.result
        before = self.read()
        r["before"] = before
        decision = plan_drain(before, self.change_id)
        r["decision"] = decision
        r["drained_by_us"] = decision in ("drain", "ours")
        changed = False
        if decision == "drain":
            self.actions.append("scontrol update nodename=%s state=drain reason=%s" % (p["node"], _quote(r["reason"])))
            if not self.module.check_mode:
                self.act(self.slurm.drain, r["reason"])
            changed = True
        elif decision == "other":
            self.actions.append("left as it is: %s by someone else (reason: %s)" % (
                before["state"], before["reason"] or "none"))
        if self.module.check_mode:
            after = dict(before)
            if decision == "drain":
                after.update(drain=True, unavailable=True, reason=r["reason"],
                             state="draining" if before["jobs_running"] else "drained")
            if before["jobs_running"] and p["wait"]:
                self.actions.append("would wait up to %ss for %d running job(s): %s" % (
                    p["wait_timeout"], before["jobs_running"], ",".join(before["job_ids"] or [])))
            r["after"] = after
            self.done(changed)
        r["after"] = self.wait() if p["wait"] else self.read()
        self.done(changed)

    def wait(self):
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
    def resume(self):
        p, r = self.module.params, self.result
        before = self.read(with_jobs=False)
        r["before"] = before
        decision = plan_resume(before, self.change_id)
        r["decision"] = decision
        r["drained_by_us"] = decision == "resume"
        if decision == "not_drained":
            r["after"] = before
            self.done(False)
        if decision == "not_ours":
            self.actions.append("left drained: the reason is not this change's (%s)" % (before["reason"] or "none"))
            r["after"] = before
            self.done(False)
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

    def query(self):
        status = self.read()
        self.result.update(decision="query", before=status, after=status,
                           drained_by_us=plan_resume(status, self.change_id) == "resume" if self.change_id else False)
        self.done(False)


ARGUMENT_SPEC = dict(
    node=dict(type="str", required=True),
    state=dict(type="str", default="drained", choices=["drained", "resumed", "query"]),
    change_id=dict(type="str"),
    operator=dict(type="str"),
    reason=dict(type="str", default="NVIDIA driver change"),
    wait=dict(type="bool", default=True),
    wait_timeout=dict(type="int", default=3600),
    poll_interval=dict(type="float", default=10.0),
    force=dict(type="bool", default=False),
    cancel_grace=dict(type="int", default=120),
    query=dict(type="str", default="scontrol", choices=["scontrol", "sinfo_json"]),
    slurm_conf=dict(type="path"),
    path=dict(type="str"),
    timeout=dict(type="float", default=20.0),
)


def main():
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        required_if=[("state", "drained", ("change_id",)), ("state", "resumed", ("change_id",))],
        supports_check_mode=True,
    )
    p = module.params
    node = (p["node"] or "").strip()
    if not node or any(ch.isspace() or ch in ",[]" for ch in node):
        module.fail_json(msg="node must be one Slurm NodeName, got %r" % p["node"])
    if p["change_id"] is not None and not valid_change_id(p["change_id"]):
        module.fail_json(msg="change_id %r is not valid: letters, digits, '.', '_' and '-', at most 64 characters, "
                             "starting with a letter or digit" % p["change_id"])
    if p["poll_interval"] <= 0:
        module.fail_json(msg="poll_interval must be positive, got %s" % p["poll_interval"])
    run = Run(module)
    if p["state"] == "drained":
        run.drain()
    elif p["state"] == "resumed":
        run.resume()
    else:
        run.query()


if __name__ == "__main__":
    main()
