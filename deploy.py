"""Converge both Sparks: host preparation, identity, QSFP fabric, SSH trust, runtime artifacts,
then verification.

    pyinfra inventory.py deploy.py          # shows the changes, asks, applies, verifies
    pyinfra --dry inventory.py deploy.py    # shows the changes only
"""

from pyinfra import local

for task in ("host_prep", "identity", "fabric", "ssh_trust", "runtime", "verify"):
    local.include(f"tasks/{task}.py")
