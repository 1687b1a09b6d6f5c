"""GPU memory, with the GB10's unified memory read from the OS."""

from __future__ import annotations

from typing import TypedDict

from pyinfra.api import FactBase

from facts.combine import read_lines

MIB_PER_GIB = 1024


class Memory(TypedDict):
    source: str
    gpus: list[str]
    total_gib: float
    available_gib: float
    nvidia_smi: str
    unreadable: list[str]


class GpuMemory(FactBase[Memory]):
    """
    GPU memory in GiB and where it was read. ``nvidia-smi`` reports it on a discrete GPU; on
    GB10 its memory fields read ``[N/A]`` (unified memory), so the figures come from
    ``/proc/meminfo``. ``nvidia_smi`` is "ok", "absent", or the error nvidia-smi printed (on
    stdout: "Failed to initialize NVML: Driver/library version mismatch" after a driver upgrade
    until the next reboot, "No devices were found"); the figures then come from /proc/meminfo.

    .. code:: python

        {"source": "/proc/meminfo", "gpus": ["NVIDIA GB10"], "total_gib": 121.6, "available_gib": 117.4,
         "nvidia_smi": "ok", "unreadable": []}
    """

    @staticmethod
    def default() -> Memory:
        return {"source": "none", "gpus": [], "total_gib": 0.0, "available_gib": 0.0, "nvidia_smi": "absent",
                "unreadable": []}

    def command(self) -> str:
        return (
            "if command -v nvidia-smi >/dev/null; then "
            "nvidia-smi --query-gpu=name,memory.total,memory.free --format=csv,noheader,nounits 2>&1 "
            "| sed 's/^/gpu: /'; else echo 'gpu-absent'; fi; "
            "grep -E '^(MemTotal|MemAvailable):' /proc/meminfo"
        )

    def process(self, output: list[str]) -> Memory:
        gpus: list[str] = []
        errors: list[str] = []
        mib = {"total": 0.0, "free": 0.0}
        meminfo: dict[str, float] = {}
        state = {"reported": True, "absent": False}

        def parse(line: str) -> None:
            if line.strip() == "gpu-absent":
                state["absent"] = True
            elif line.startswith("gpu: "):
                fields = [field.strip() for field in line[5:].split(",")]
                if len(fields) != 3 or not fields[0]:
                    errors.append(line[5:].strip())
                    return
                gpus.append(fields[0])
                try:
                    mib["total"] += float(fields[1])
                    mib["free"] += float(fields[2])
                except ValueError:  # "[N/A]" or "[Not Supported]"
                    state["reported"] = False
            else:
                key, value = line.split(":", 1)
                if key not in ("MemTotal", "MemAvailable"):
                    raise ValueError(line)
                meminfo[key] = int(value.split()[0]) / (1024 * 1024)

        unreadable = read_lines(output, parse)
        nvidia_smi = "absent" if state["absent"] else (errors[0] if errors and not gpus else "ok")
        if gpus and state["reported"]:
            return {"source": "nvidia-smi", "gpus": gpus, "total_gib": round(mib["total"] / MIB_PER_GIB, 1),
                    "available_gib": round(mib["free"] / MIB_PER_GIB, 1), "nvidia_smi": nvidia_smi, "unreadable": unreadable}
        return {"source": "/proc/meminfo" if meminfo else "none", "gpus": gpus,
                "total_gib": round(meminfo.get("MemTotal", 0.0), 1), "available_gib": round(meminfo.get("MemAvailable", 0.0), 1),
                "nvidia_smi": nvidia_smi, "unreadable": unreadable}
