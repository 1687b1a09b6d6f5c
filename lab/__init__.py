"""The lab: two emulated DGX Sparks on one machine, for the tests, the benchmarks and for trying
the project before owning the hardware. Run as root: `python -m lab up|down|status`.

Each node is a Debian root file system (debootstrap once, cached; an overlay per node) in its own
network, mount, UTS, IPC and PID namespaces, with sshd and a real dockerd supervised by PID 1
(node_init.py). Like cloned factory images, both start with the same /etc/machine-id and SSH host
keys. A bridge carries the management LAN (198.51.100.0/24); veth pairs named as on a Spark are
the QSFP cable. Emulated from real output formats, in the lab only (hardware.py, hwsync.py,
factory/, shim/): link speed in sysfs, the CX-7 RDMA tree, a GB10 nvidia-smi, unified-memory
/proc/meminfo, the Ubuntu userns sysctl key, `netplan apply` without networkd, and an unlimited
memlock, which this machine's kernel withholds. The product never imports this package.
"""
