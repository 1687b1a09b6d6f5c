"""Converge every Spark of the site (a pair on one cable, or N through a switch): host
preparation, identity, the QSFP fabric, SSH trust, runtime artifacts, the serving stacks, the
front door, observability (Prometheus, the node exporters, their rules), then verification.

    pyinfra inventory.py deploy.py          # shows the changes, asks, applies, verifies
    pyinfra --dry inventory.py deploy.py    # shows the changes only

One include per line: pyinfra orders operations by where they are called, so the steps of
every node interleave in this order.
"""

from pyinfra import local

from operations.readings import plan_every_module

plan_every_module()  # change detection reads each node once, for the steps of every task below
local.include("tasks/host_prep.py")
local.include("tasks/identity.py")
local.include("tasks/fabric.py")
local.include("tasks/ssh_trust.py")
local.include("tasks/runtime.py")
local.include("tasks/serving.py")
local.include("tasks/door.py")
local.include("tasks/observability.py")
local.include("tasks/verify.py")
