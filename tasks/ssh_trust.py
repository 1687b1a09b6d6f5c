"""Passwordless SSH for the deploy user over the fabric: from the head to every worker, and from
each node to the next in rank order (the chain the runtime image and the model go down)."""

from pyinfra import host

from operations.ssh_trust import authorized_senders, known_receivers

cluster = host.data.cluster
user = cluster.deploy_user

known_receivers(
    name=f"Give {user} a key and record the host keys of the nodes it logs in to at their fabric addresses",
    user=user,
    rails=cluster.node(host.name).rail_data,
)

authorized_senders(name=f"Authorize for {user} the keys of the nodes that log in to it", user=user)
