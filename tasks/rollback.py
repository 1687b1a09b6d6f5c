"""Return every node to the state that served before the one in service:

    pyinfra --dry inventory.py tasks/rollback.py    # each node's stack diff; changes nothing
    pyinfra inventory.py tasks/rollback.py

The head stops, every worker starts fresh from its record, then the head; the run ends when the
API generates a token, and that state is recorded as the one that serves: a second rollback
returns to where the first began. The state keeps its image and model on every node. The site
still names the newer state: the next deploy returns to it; to stay, change the site.
"""

from pyinfra import host

from operations.rollback import rolled_back
from operations.stack import stack_settings

cluster = host.data.cluster

rolled_back(
    name="Return every node to the state that served before this one (the head stopped, the workers started, then the head)",
    stacks=[stack_settings(cluster, node.hostname) for node in cluster.nodes],
    ready_timeout=cluster.settings.serving_ready_timeout,
)
