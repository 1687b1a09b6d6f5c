"""Rules for one node as a whole: limits, identity against every other node, the deploy user,
Docker, GPU memory, SSH to the nodes it reaches, and whether the node answered at all."""

from __future__ import annotations

from checks import FAIL, PASS, WARN, Check
from checks.fabric import rail_checks
from checks.runtime import image_check, model_check
from checks.serving import api_checks, container_check
from cluster import Cluster
from facts.verify import ssh_targets

USERNS_KEY = "kernel.apparmor_restrict_unprivileged_userns"
NVML_FIXES = {
    "version mismatch": "the NVIDIA driver was upgraded and the old one is still loaded: reboot this node",
    "No devices were found": "the GPU is not visible: check `nvidia-smi -L` and `dmesg | grep -i nvrm`, then reboot",
}


def unreachable(name: str, address: str, port: int) -> Check:
    return Check(name, "reachable over SSH", FAIL, f"no SSH answer at {address}:{port}",
                 "check that the node is powered on and booted, that sshd runs, and the management LAN "
                 f"(`ssh -p {port} {address}` from here); then run the deploy again")


def earlier_step_failed(name: str, step: str) -> Check:
    """A node that answers over SSH but failed a step of this run (pyinfra skipped it since)."""
    return Check(name, "steps of this run", FAIL, f"failed here: {step} (its error is above); later steps left this node out",
                 "it answers over SSH: fix what that error says, then run the deploy again")


def node_checks(name: str, cluster: Cluster, readings: dict[str, dict | None]) -> list[Check]:
    """Everything that must hold on one node for serving with the others, rails first.
    ``readings`` holds every node's, by name in rank order (None for a node that did not answer)."""
    mine = readings[name]
    others = {other: reading for other, reading in readings.items() if other != name}
    checks = rail_checks(name, cluster, mine)
    memlock = mine["memlock"]["limit"]
    if memlock == "unlimited":
        checks.append(Check(name, "memlock (fresh login)", PASS, "unlimited"))
    else:
        checks.append(Check(name, "memlock (fresh login)", FAIL, f"{memlock} KiB" if memlock else "could not be read",
                            "run the deploy again, then log in anew over OpenSSH (Tailscale SSH skips pam_limits)"))
    userns = mine["userns"]["value"]
    if userns is None:
        checks.append(Check(name, "userns sysctl", PASS, "kernel has no AppArmor userns key"))
    elif userns == 0:
        checks.append(Check(name, "userns sysctl", PASS, f"{USERNS_KEY} = 0"))
    else:
        checks.append(Check(name, "userns sysctl", FAIL, f"{USERNS_KEY} = {userns}",
                            f"run the deploy again, or `sudo sysctl -w {USERNS_KEY}=0`"))
    checks += identity_checks(name, mine, others)
    checks += user_checks(name, cluster.deploy_user, mine, others)
    checks += memory_checks(name, cluster.settings.memory_floor_gib, mine["memory"])
    for (other, address), login in zip(ssh_targets(cluster, name), mine["ssh_to"]):
        if login["ok"]:
            checks.append(Check(name, f"SSH to {other} at {address}", PASS, "passwordless"))
        elif others[other] is None:
            checks.append(Check(name, f"SSH to {other} at {address}", FAIL, f"{other} does not answer",
                                f"see {other}'s 'reachable over SSH' row"))
        else:
            checks.append(Check(name, f"SSH to {other} at {address}", FAIL, "login refused or asks for input",
                                "run the deploy again (tasks/ssh_trust.py sets the key and known_hosts)"))
    head = cluster.head.hostname
    checks.append(image_check(name, cluster.image.tag, mine["image"], None if name == head else head, readings[head]))
    checks.append(model_check(name, cluster.node(name).role, cluster.model.source, mine["model"], readings[head]))
    checks.append(container_check(name, cluster.profile_name, mine["serving"]))
    if mine["api"] is not None:
        checks += api_checks(name, cluster.settings.api_host, cluster.settings.api_port, mine["api"], mine["listening"])
    checks += unreadable_checks(name, mine)
    return checks


def identity_checks(name: str, mine: dict, others: dict[str, dict | None]) -> list[Check]:
    """The machine id against every other node's (any two equal ids are a FAIL naming both), and
    the SSH host keys."""
    etc = mine["identity"]["etc"]
    read = {other: reading for other, reading in others.items() if reading is not None}
    unread = [other for other in others if other not in read]
    same = [other for other, reading in read.items() if reading["identity"]["etc"] == etc]
    if not etc:
        checks = [Check(name, "machine id", FAIL, "none", "run `sudo systemd-machine-id-setup` on this node, then reboot it")]
    elif same:
        checks = [Check(name, "machine id", FAIL, f"{etc} is also {' and '.join(same)}'s",
                        "run the deploy (it gives each worker whose id an earlier node has a new one), then reboot that worker")]
    else:
        detail = f"{etc}, distinct from {', '.join(read)}" if read else etc
        checks = [Check(name, "machine id", PASS, detail + (f" ({', '.join(unread)} not read)" if unread else ""))]
    shared: dict[str, list[str]] = {}  # the kinds of key, to the nodes that have the same
    for other, reading in read.items():
        theirs = reading["host_keys"]["fingerprints"]
        kinds = ", ".join(sorted(kind for kind, fingerprint in mine["host_keys"]["fingerprints"].items() if theirs.get(kind) == fingerprint))
        if kinds:
            shared.setdefault(kinds, []).append(other)
    if shared:
        checks.append(Check(name, "SSH host keys", WARN,
                            "; ".join(f"{kinds} shared with {', '.join(nodes)}" for kinds, nodes in shared.items()) + " (cloned image)",
                            "on each worker that shares them: sudo rm /etc/ssh/ssh_host_* && sudo dpkg-reconfigure openssh-server"))
    elif read:
        checks.append(Check(name, "SSH host keys", PASS, f"distinct from {', '.join(read)}"))
    return checks


def user_checks(name: str, user_name: str, mine: dict, others: dict[str, dict | None]) -> list[Check]:
    user = mine["user"]
    read = {other: reading["user"] for other, reading in others.items() if reading is not None}
    checks = []
    if read:
        if user["exists"] and all(theirs["exists"] and theirs["uid"] == user["uid"] for theirs in read.values()):
            checks.append(Check(name, "deploy user", PASS, f"{user_name} uid {user['uid']} on every node"))
        else:
            differ = ", ".join(f"{other} {theirs['uid']}" for other, theirs in read.items() if theirs["uid"] != user["uid"] or not theirs["exists"])
            checks.append(Check(name, "deploy user", FAIL, f"{user_name}: here {user['uid']}, {differ}",
                                "create the same user with the same uid on every node"))
    if not mine["docker"]:
        checks.append(Check(name, "docker", FAIL, "docker not found", "install Docker (DGX OS ships it) and run again"))
    elif "docker" not in user["groups"]:
        checks.append(Check(name, "docker", FAIL, f"{user_name} is not in the docker group", "run the deploy again"))
    else:
        checks.append(Check(name, "docker", PASS, f"{mine['docker']}, {user_name} in group docker"))
    return checks


def memory_checks(name: str, floor_gib: float, memory: dict) -> list[Check]:
    checks = []
    state = memory["nvidia_smi"]
    if state not in ("ok", "absent"):
        fix = next((text for key, text in NVML_FIXES.items() if key in state),
                   "run `nvidia-smi` on the node; reinstall or reload the driver, then reboot")
        checks.append(Check(name, "GPU driver", FAIL, f"nvidia-smi: {state}", fix))
    source = memory["source"] + (f", {', '.join(memory['gpus'])}" if memory["gpus"] else
                                 ", no nvidia-smi" if state == "absent" else ", nvidia-smi failed")
    detail = f"{memory['available_gib']} GiB available of {memory['total_gib']} ({source})"
    if memory["available_gib"] >= floor_gib:
        checks.append(Check(name, "GPU memory", PASS, detail))
    else:
        checks.append(Check(name, "GPU memory", FAIL, f"{detail}, floor {floor_gib}",
                            "stop what holds the memory (nvidia-smi, free -g) or lower memory_floor_gib"))
    return checks


def unreadable_checks(name: str, readings: dict) -> list[Check]:
    """A reading with lines it could not make sense of is said so, not silently dropped."""
    checks = []
    for key, reading in readings.items():
        for item in reading if isinstance(reading, list) else [reading]:
            if isinstance(item, dict) and item.get("unreadable"):
                line = item["unreadable"][0]
                checks.append(Check(name, f"reading {key}", WARN, f"unreadable output: {line[:120]!r}",
                                    "the node printed something this deploy does not know; report it with that line"))
    if readings.get("unreadable"):
        checks.append(Check(name, "reading", WARN, f"unreadable output: {readings['unreadable'][0][:120]!r}",
                            "the node printed something this deploy does not know; report it with that line"))
    return checks
