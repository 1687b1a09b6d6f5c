"""Passwordless SSH for the deploy user from the head to the worker over the fabric."""

from pyinfra import host

from operations.ssh_trust import authorized_peer_key, known_peer_addresses, user_key_pair

user = host.data.deploy_user

if host.data.role == "head":
    user_key_pair(name=f"Give {user} on the head an SSH key", user=user)

if host.data.role == "worker":
    authorized_peer_key(name=f"Authorize the head's key for {user} on the worker", user=user, peer_name=host.data.peer_name)

if host.data.role == "head":
    known_peer_addresses(
        name="Record the worker's host key at its fabric addresses",
        user=user,
        rails=host.data.rails,
        peer_rails=host.data.peer_rails,
    )
