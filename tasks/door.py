"""The front door (docs/front-door.md): HAProxy on the head answers the clients at
api_host:api_port and holds their requests while vLLM, behind it on loopback, restarts for a
change, a rollback or a heal. After the stacks: vLLM has left the API's port for its own.

    pyinfra inventory.py tasks/door.py      # this step alone, on converged nodes
"""

from pyinfra import host

from operations.door import door_running, door_settings

cluster = host.data.cluster
settings = cluster.settings

door_running(
    name=f"Run the front door on the head ({settings.api_host}:{settings.api_port}, vLLM behind it on 127.0.0.1:{settings.vllm_port})",
    settings=door_settings(cluster),
)
