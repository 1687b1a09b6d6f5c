"""The serving cluster at a glance; changes nothing:

    pyinfra -y inventory.py tasks/status.py

One table: each node's vLLM container (state, uptime, restarts, image, profile), its watchdog,
GPU memory and rails, in rank order; the head's API and speculative-decoding acceptance. A bad
row names the fix, and a failing node shows the last lines of its log. Exits non-zero on any FAIL.
"""

from pyinfra import host

from operations.status import status

status(
    name="Status of the serving cluster",
    node_names=[node.hostname for node in host.data.cluster.nodes],
)
