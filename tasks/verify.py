"""Verification: read every node back and print one readiness table; fail on any FAIL.
The head reports, or the first node that answers when the head does not. With canary=full, the
head also runs the canary set against the state that serves (docs/operating.md).

    pyinfra inventory.py tasks/verify.py [--data canary=full]
"""

from pyinfra import host

from operations.canary import checked_now
from operations.stack import stack_settings
from operations.verify import readiness

cluster = host.data.cluster
readiness(
    name="Verify every node is ready to serve",
    node_names=[node.hostname for node in cluster.nodes],
)
if cluster.settings.canary == "full":
    checked_now(
        name="Run the canary set against the state that serves, compared with its recorded answers",
        settings=stack_settings(cluster, cluster.head.hostname),
    )
