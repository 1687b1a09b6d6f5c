"""Serving: the compose stacks of every node for the active profile, brought up in the order
multi-node vLLM needs (the head stops first, fresh workers start, then the head), and only when
something changed. Ends when the API on the head generates a token, recording on every node the
state that serves; when none comes, every node returns to the state that served before (unless
rollback_on_failure is false) and the run fails saying why. Once the head serves, the model store
keeps only what a stack file names (the stacks in place, and the recorded states').

    pyinfra inventory.py tasks/serving.py      # the stacks alone, on converged nodes
"""

from pyinfra import host

from layout import paths, store_entry
from operations.serving import head_stopped_for_change, stack_up
from operations.stack import stack_settings
from operations.store import store_pruned

cluster = host.data.cluster
stacks = [stack_settings(cluster, node.hostname) for node in cluster.nodes]
ranks = "rank 1" if cluster.size == 2 else f"ranks 1-{cluster.size - 1}"
parallel = f"tensor parallel {cluster.tensor_parallel} x pipeline parallel {cluster.pipeline_parallel}"

head_stopped_for_change(
    name=f"Stop the head's vLLM if any node's stack changes (profile {cluster.profile_name})",
    stacks=stacks,
)

stack_up(
    name=f"Start every worker's stack ({ranks}, headless), fresh if the cluster changed (profile {cluster.profile_name})",
    role="worker", stacks=stacks, ready_timeout=cluster.settings.serving_ready_timeout,
    rollback=cluster.settings.rollback_on_failure,
)

stack_up(
    name=f"Start the head's stack (rank 0, the API; {parallel}) and wait for its first token (profile {cluster.profile_name})",
    role="head", stacks=stacks, ready_timeout=cluster.settings.serving_ready_timeout,
    rollback=cluster.settings.rollback_on_failure,
)

store_pruned(
    name="Remove the model store's directories that no stack file names (once the head serves)",
    model_dir=cluster.settings.model_dir, stack_dir=cluster.settings.stack_dir,
    keep=store_entry(cluster.settings.model_dir, cluster.model.source), user=cluster.deploy_user,
    programs=paths(cluster.settings.state_dir, "")["programs"],
)
