# Sourced by scripts/quickstart and scripts/test: installs what they need, idempotently.
# Debian packages for the lab and the tests; a virtualenv with the pinned requirements.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$REPO/.venv"
LAB_PACKAGES=(debootstrap iproute2 openssh-client iputils-ping gcc netplan.io util-linux python3-venv)

need_root() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "$1 needs root (network namespaces, mounts, debootstrap): run it as root." >&2
    exit 1
  fi
}

install_lab_packages() {
  local missing=()
  for package in "${LAB_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" || missing+=("$package")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "--> Installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

install_venv() {
  if [ ! -x "$VENV/bin/python" ]; then
    echo "--> Creating $VENV"
    python3 -m venv "$VENV"
  fi
  if ! cmp -s "$REPO/requirements.txt" "$VENV/.requirements.txt"; then
    echo "--> Installing requirements.txt"
    "$VENV/bin/pip" install -q -r "$REPO/requirements.txt"
    cp "$REPO/requirements.txt" "$VENV/.requirements.txt"
  fi
}
