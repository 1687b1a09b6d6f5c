"""Identity of cloned factory images: give every worker a machine id of its own (never the head)."""

from pyinfra import host
from pyinfra.operations import server

from operations.identity import distinct_machine_id

repair = distinct_machine_id(
    name="Give every worker a machine id of its own",
    expected_hostname=host.name,
)

if host.data.role == "worker" and host.data.cluster.settings.reboot_worker:
    server.reboot(
        name="Reboot the worker so every service picks up its new machine id",
        _if=repair.did_change,
    )
