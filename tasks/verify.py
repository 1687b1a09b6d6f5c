"""Verification: read both nodes back and print one readiness table; fail on any FAIL.
The head reports, or the worker when the head does not answer.

    pyinfra inventory.py tasks/verify.py
"""

from pyinfra import host

from operations.verify import readiness

readiness(
    name="Verify both nodes are ready to serve",
    node_names=[host.name, host.data.peer_name],
)
