"""Serving: the compose stacks of both nodes for the active profile, brought up in the order
two-node vLLM needs (the head stops first, a fresh worker starts, then the head), and only when
something changed. Ends when the API on the head generates a token.

    pyinfra inventory.py tasks/serving.py      # the stacks alone, on converged nodes
"""

from pyinfra import host, inventory

from operations.serving import head_stopped_for_change, stack_settings, stack_up

mine = stack_settings(host.data)
theirs = stack_settings(inventory.get_host(host.data.peer_name).data)

head_stopped_for_change(
    name=f"Stop the head's vLLM if either stack changes (profile {host.data.profile})",
    settings=mine, peer_settings=theirs,
)

stack_up(
    name=f"Start the worker's stack (rank 1, headless), fresh if the pair changed (profile {host.data.profile})",
    role="worker", settings=mine, peer_settings=theirs, ready_timeout=host.data.serving_ready_timeout,
)

stack_up(
    name=f"Start the head's stack (rank 0, the API) and wait for its first token (profile {host.data.profile})",
    role="head", settings=mine, peer_settings=theirs, ready_timeout=host.data.serving_ready_timeout,
)
