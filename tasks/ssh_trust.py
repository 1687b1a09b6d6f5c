"""Passwordless SSH for the deploy user from the head to the worker over the fabric."""

from pyinfra import host

from operations.ssh_trust import authorized_peer_key, head_trust

user = host.data.deploy_user

head_trust(
    name=f"Give {user} on the head a key and record the worker's host key at its fabric addresses",
    user=user,
    rails=host.data.rails,
    peer_rails=host.data.peer_rails,
)

authorized_peer_key(name=f"Authorize the head's key for {user} on the worker", user=user)
