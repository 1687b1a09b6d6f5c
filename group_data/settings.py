"""The settings' defaults, read into cluster.Settings (site_config.py): a site overrides them in
`site.toml` under [settings], a single run with `pyinfra ... --data key=value`. What is served
(model, images, profiles) is data of its own: group_data/serving.toml. (pyinfra reads
group_data/all.py into every host's data itself; these reach the code only as the typed site.)"""

# The fabric between the nodes: "direct" (two Sparks, one QSFP cable) or "switch" (2 or more, one
# cable each into a switch, ports forced to 200G with auto-negotiation off)
topology = "direct"

# Serving
profile = "adaptive"
api_host = "127.0.0.1"
api_port = 8888
api_public = False  # a non-loopback api_host is refused unless this is true
# The front door (docs/front-door.md): HAProxy on the head answers at api_host:api_port and holds
# requests while vLLM restarts (up to serving_ready_timeout); vLLM listens on loopback behind it.
vllm_port = 8889  # vLLM's own port, on the head's loopback only
door_drain_seconds = 600  # how long a planned stop waits for the requests in flight to finish
door_metrics_port = 8405  # the door's Prometheus metrics, on the head's loopback
door_request_kib = 1024  # a request up to this size is held whole, so it can be sent again to the next vLLM
master_port = 25000
watchdog_port = 25001  # each side's watchdog status, on its own fabric address
block_size = 256
speculative_method = "dspark"
speculative_options = {}  # more keys of --speculative-config, e.g. {"prompt_lookup_max": 3}
generation_config = {"temperature": 0.0, "top_p": 1.0}  # request defaults (--override-generation-config): greedy
vllm_extra_args = []  # more `vllm serve` flags, on both nodes
serving_ready_timeout = 1800  # seconds the deploy waits for the first generated token
rollback_on_failure = True  # no first token after a change: every node returns to the state that served; false: left for debugging
serving_env = {
    "NCCL_NET": "IB",
    "NCCL_IB_DISABLE": "0",
    "NCCL_CROSS_NIC": "1",
    "NCCL_NVLS_ENABLE": "0",
    "VLLM_DSPARK_GPU_REJECTED_CONTEXT_MASK": "1",
    "VLLM_USE_BREAKABLE_CUDAGRAPH": "0",
    "VLLM_USE_B12X_MOE": "1",
    "VLLM_USE_B12X_WO_PROJECTION": "1",
    "TORCH_CUDA_ARCH_LIST": "12.1a",
    "HF_HUB_OFFLINE": "1",
}

# Containers (a site without GPUs or InfiniBand devices, like the lab, overrides these)
container_gpus = "all"
container_devices = ["/dev/infiniband"]
container_ulimits = {"memlock": -1, "stack": 67108864, "nofile": 1048576}
container_mounts = []  # host paths mounted read-only, at the same path, into every runtime container
container_env = {}  # more environment for every runtime container (the hub fetch keeps its own HF_HOME, HF_XET_*)
# secrets for every vLLM container: NAME = a root-only file (mode 600 or 400) on every node under
# /etc/dual-spark/secrets/, mounted read-only at /run/secrets/NAME, never in the environment
container_secrets = {}

# Runtime artifacts: everything dual-spark keeps on the nodes lives under state_dir
state_dir = "/var/lib/dual-spark"
model_dir = "/var/lib/dual-spark/model"
stack_dir = "/etc/dual-spark"
hf_endpoint = "https://huggingface.co"
hf_endpoint_insecure_http = False  # true: an http:// hf_endpoint (a mirror on your LAN) is meant; the token crosses in clear
hf_token_file = "~/.cache/huggingface/token"  # on the head, the deploy user's; only gated repositories need it
verify_model = "size"  # "full": hash every file of the model on both nodes again
replication_streams = 4  # parallel TCP streams per fabric rail
show_program_diffs = False  # the diff shows each changed helper program as one line; true: its full diff

# QSFP fabric
fabric_mtu = 9000
netplan_path = "/etc/netplan/40-dual-spark.yaml"
expected_link_speed_mbps = 200000

# Host preparation
host_packages = [
    "rsync",
    "iperf3",
    "perftest",
    "rdma-core",
    "ibverbs-utils",
    "infiniband-diags",
    "python3-venv",
]
memlock_limits_path = "/etc/security/limits.d/99-rdma.conf"
memlock_systemd_path = "/etc/systemd/system.conf.d/90-rdma-memlock.conf"
userns_sysctl_path = "/etc/sysctl.d/60-apparmor-userns.conf"
reboot_worker = False

# Verification
memory_floor_gib = 95

# Observability (docs/observability.md): Prometheus from the OS's packages on the head, on loopback,
# scraping vLLM and a node exporter on every node (on its rail 0 address), with the deploy's
# recording and alert rules; the deploy's own collector adds the GPU, the rails, the watchdog and
# the state that serves. false: none of it is installed or changed (nothing is removed).
observability = True
prometheus_port = 9090  # on the head's loopback, like the API: reach it through the SSH tunnel
prometheus_retention_days = 15  # samples older than this are dropped...
prometheus_retention_gib = 8  # ...and the oldest too once the store is this big: it never fills the disk
node_exporter_port = 9100  # on each node's rail 0 address, never the management LAN
metrics_interval_seconds = 15  # how often Prometheus scrapes and the collector reads
# A heal is expected to serve within 1.5 times the head's last measured start plus this margin (the
# watchdog's detection and a container's restart): DualSparkApiDown warns until then, pages after
heal_margin_seconds = 120
# Objectives (docs/observability.md#objectives): what clients are owed, each watched by burn-rate
# alerts over windows from five minutes to three days. A bound is one of vLLM's bucket bounds.
slo_error_ratio = 0.01  # at most this share of requests fail (a 5xx from the door, or vLLM ending one in error)
slo_ttft_seconds = 10.0  # the first token within this long...
slo_ttft_target = 0.95  # ...for at least this share of requests
slo_itl_seconds = 0.2  # each next token within this long of the one before...
slo_itl_target = 0.95  # ...for at least this share of tokens
# Grafana on the head, on loopback, from an image pinned by digest (registry/name@sha256:<64 hex>),
# with the deploy's dashboards; "": no Grafana (the dashboards are in files/observability/dashboards/)
grafana_image = ""
grafana_port = 3000
