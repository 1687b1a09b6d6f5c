"""GPU memory, with the GB10's unified memory read from the OS."""

from __future__ import annotations

from pyinfra.api import FactBase

MIB_PER_GIB = 1024


class GpuMemory(FactBase[dict]):
    """
    GPU memory in GiB and where it was read. ``nvidia-smi`` reports it on a discrete GPU;
    on GB10 its memory fields read ``[N/A]`` (unified memory), so the figures come from
    ``/proc/meminfo`` instead. ``gpus`` lists what nvidia-smi named, empty when it is absent.

    .. code:: python

        {"source": "/proc/meminfo", "gpus": ["NVIDIA GB10"], "total_gib": 121.6, "available_gib": 117.4}
    """

    default = dict

    def command(self) -> str:
        return (
            "nvidia-smi --query-gpu=name,memory.total,memory.free --format=csv,noheader,nounits "
            "2>/dev/null | sed 's/^/gpu: /'; grep -E '^(MemTotal|MemAvailable):' /proc/meminfo"
        )

    def process(self, output: list[str]) -> dict:
        gpus, total_mib, free_mib, meminfo = [], 0.0, 0.0, {}
        reported = True
        for line in output:
            if line.startswith("gpu: "):
                name, total, free = (field.strip() for field in line[5:].split(","))
                gpus.append(name)
                try:
                    total_mib += float(total)
                    free_mib += float(free)
                except ValueError:  # "[N/A]" or "[Not Supported]"
                    reported = False
            elif ":" in line:
                key, value = line.split(":", 1)
                meminfo[key] = int(value.split()[0]) / (1024 * 1024)
        if gpus and reported:
            return {"source": "nvidia-smi", "gpus": gpus,
                    "total_gib": round(total_mib / MIB_PER_GIB, 1), "available_gib": round(free_mib / MIB_PER_GIB, 1)}
        return {"source": "/proc/meminfo", "gpus": gpus,
                "total_gib": round(meminfo.get("MemTotal", 0), 1), "available_gib": round(meminfo.get("MemAvailable", 0), 1)}
