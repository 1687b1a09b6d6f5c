"""Rules for one node as a whole: limits, identity, the deploy user, Docker, GPU memory, SSH to
the peer, and whether the node answered at all."""

from __future__ import annotations

from checks import FAIL, PASS, WARN, Check
from checks.fabric import rail_checks
from checks.runtime import image_check, model_check
from checks.serving import api_checks, container_check
from serving_data import model_source

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


def node_checks(name: str, data, readings: dict, peer_name: str, peer: dict | None) -> list[Check]:
    """Everything that must hold on one node for two-node serving, rails first. ``peer`` is the
    other node's readings, None when it did not answer."""
    checks = rail_checks(name, data, readings)
    memlock = readings["memlock"]["limit"]
    if memlock == "unlimited":
        checks.append(Check(name, "memlock (fresh login)", PASS, "unlimited"))
    else:
        checks.append(Check(name, "memlock (fresh login)", FAIL, f"{memlock} KiB" if memlock else "could not be read",
                            "run the deploy again, then log in anew over OpenSSH (Tailscale SSH skips pam_limits)"))
    userns = readings["userns"]["value"]
    if userns is None:
        checks.append(Check(name, "userns sysctl", PASS, "kernel has no AppArmor userns key"))
    elif userns == 0:
        checks.append(Check(name, "userns sysctl", PASS, f"{USERNS_KEY} = 0"))
    else:
        checks.append(Check(name, "userns sysctl", FAIL, f"{USERNS_KEY} = {userns}",
                            f"run the deploy again, or `sudo sysctl -w {USERNS_KEY}=0`"))
    checks += identity_checks(name, readings, peer_name, peer)
    checks += user_checks(name, data, readings, peer_name, peer)
    checks += memory_checks(name, data, readings["memory"])
    for address, login in zip([p["address"] for p in data.peer_rails], readings["ssh_to_peer"]):
        if login["ok"]:
            checks.append(Check(name, f"SSH to {peer_name} at {address}", PASS, "passwordless"))
        elif peer is None:
            checks.append(Check(name, f"SSH to {peer_name} at {address}", FAIL, f"{peer_name} does not answer",
                                f"see {peer_name}'s 'reachable over SSH' row"))
        else:
            checks.append(Check(name, f"SSH to {peer_name} at {address}", FAIL, "login refused or asks for input",
                                "run the deploy again (tasks/ssh_trust.py sets the key and known_hosts)"))
    image = data.images[data.profiles[data.profile]["image"]]
    checks.append(image_check(name, image["tag"], readings["image"], peer["image"] if peer else None, peer_name))
    source = model_source(data.model)
    head_model = readings["model"] if data.role == "head" else (peer["model"] if peer else None)
    checks.append(model_check(name, data.role, source, readings["model"], head_model))
    checks.append(container_check(name, data.profile, readings["serving"]))
    if readings["api"] is not None:
        checks += api_checks(name, data.api_host, data.api_port, readings["api"], readings["listening"])
    checks += unreadable_checks(name, readings)
    return checks


def identity_checks(name: str, readings: dict, peer_name: str, peer: dict | None) -> list[Check]:
    mine = readings["identity"]["etc"]
    if peer is None:
        checks = [Check(name, "machine id", PASS if mine else FAIL, f"{mine} ({peer_name} not read)" if mine else "none")]
    elif mine and mine != peer["identity"]["etc"]:
        checks = [Check(name, "machine id", PASS, f"{mine}, distinct from {peer_name}")]
    else:
        checks = [Check(name, "machine id", FAIL, f"{mine} is also {peer_name}'s",
                        "run the deploy (it gives the worker a new id), then reboot the worker")]
    if peer is None:
        return checks
    theirs = peer["host_keys"]["fingerprints"]
    shared = sorted(kind for kind, fingerprint in readings["host_keys"]["fingerprints"].items() if theirs.get(kind) == fingerprint)
    if shared:
        checks.append(Check(name, "SSH host keys", WARN, f"{', '.join(shared)} shared with {peer_name} (cloned image)",
                            "on the worker: sudo rm /etc/ssh/ssh_host_* && sudo dpkg-reconfigure openssh-server"))
    else:
        checks.append(Check(name, "SSH host keys", PASS, f"distinct from {peer_name}"))
    return checks


def user_checks(name: str, data, readings: dict, peer_name: str, peer: dict | None) -> list[Check]:
    user = readings["user"]
    checks = []
    if peer is not None:
        theirs = peer["user"]
        if user["exists"] and theirs["exists"] and user["uid"] == theirs["uid"]:
            checks.append(Check(name, "deploy user", PASS, f"{data.deploy_user} uid {user['uid']} on both nodes"))
        else:
            checks.append(Check(name, "deploy user", FAIL, f"{data.deploy_user}: here {user['uid']}, {peer_name} {theirs['uid']}",
                                "create the same user with the same uid on both nodes"))
    if not readings["docker"]:
        checks.append(Check(name, "docker", FAIL, "docker not found", "install Docker (DGX OS ships it) and run again"))
    elif "docker" not in user["groups"]:
        checks.append(Check(name, "docker", FAIL, f"{data.deploy_user} is not in the docker group", "run the deploy again"))
    else:
        checks.append(Check(name, "docker", PASS, f"{readings['docker']}, {data.deploy_user} in group docker"))
    return checks


def memory_checks(name: str, data, memory: dict) -> list[Check]:
    checks = []
    state = memory["nvidia_smi"]
    if state not in ("ok", "absent"):
        fix = next((text for key, text in NVML_FIXES.items() if key in state),
                   "run `nvidia-smi` on the node; reinstall or reload the driver, then reboot")
        checks.append(Check(name, "GPU driver", FAIL, f"nvidia-smi: {state}", fix))
    source = memory["source"] + (f", {', '.join(memory['gpus'])}" if memory["gpus"] else
                                 ", no nvidia-smi" if state == "absent" else ", nvidia-smi failed")
    detail = f"{memory['available_gib']} GiB available of {memory['total_gib']} ({source})"
    if memory["available_gib"] >= data.memory_floor_gib:
        checks.append(Check(name, "GPU memory", PASS, detail))
    else:
        checks.append(Check(name, "GPU memory", FAIL, f"{detail}, floor {data.memory_floor_gib}",
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
