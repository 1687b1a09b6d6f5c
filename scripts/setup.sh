# Sourced by scripts/quickstart and scripts/test: installs what they need, idempotently.
# Debian packages for the lab and the tests; a virtualenv with the pinned requirements.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$REPO/.venv"
LAB_PACKAGES=(debootstrap iproute2 openssh-client iputils-ping gcc netplan.io util-linux python3-venv)
# The tests' own: a real browser renders the lab's Prometheus (tests/e2e/test_48_observability.py);
# rsync copies a model directory in tests/test_runtime_commands.py as the deploy does on the head;
# HAProxy checks the front door's configuration and runs it for tests/programs/test_door.py.
TEST_PACKAGES=(chromium rsync haproxy)

need_root() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "$1 needs root (network namespaces, mounts, debootstrap): run it as root." >&2
    exit 1
  fi
}

install_lab_packages() {
  local missing=()
  for package in "${LAB_PACKAGES[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" || missing+=("$package")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "--> Installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

# The lab's Debian images (lab/image.py), built in the background while the installs that follow
# run (`wait_for_lab_images` before the lab is used): on a fresh machine debootstrap's downloads and
# pip's overlap. Once built they are cached, and this returns at once.
build_lab_images() {
  LAB_IMAGES_LOG=$(mktemp /tmp/sparklab-images.XXXXXX)
  (cd "$REPO" && exec python3 -m lab.image) >"$LAB_IMAGES_LOG" 2>&1 &
  LAB_IMAGES=$!
}

wait_for_lab_images() {
  if ! wait "$LAB_IMAGES"; then
    echo "Building the lab's images failed:" >&2
    cat "$LAB_IMAGES_LOG" >&2
    rm -f "$LAB_IMAGES_LOG"
    exit 1
  fi
  rm -f "$LAB_IMAGES_LOG"
}

# The fast tier as an ordinary user, in the background: it needs neither root nor the lab. On a
# copy of the tree that user can read, in a virtualenv of the system Python (some machines' default
# Python lives under /root, which other users cannot enter). Its job is $FAST_TIER, its output in
# $FAST_TIER_LOG (scripts/test waits for it and prints it). Its virtualenv is made at once; its
# tests start once the file $1 exists (scripts/test makes it when the lab lends its cores).
FAST_TIER_USER=sparkci
start_fast_tier() {
  id -u "$FAST_TIER_USER" >/dev/null 2>&1 || useradd --create-home "$FAST_TIER_USER"
  FAST_TIER_COPY=$(mktemp -d /tmp/dual-spark-fast-tier.XXXXXX)
  FAST_TIER_LOG=$(mktemp /tmp/dual-spark-fast-tier.XXXXXX.log)
  tar -C "$REPO" --exclude=./.venv --exclude=./.git -cf - . | tar -xf - -C "$FAST_TIER_COPY"
  chown -R "$FAST_TIER_USER": "$FAST_TIER_COPY"
  runuser -u "$FAST_TIER_USER" -- sh -ec "
    cd '$FAST_TIER_COPY'
    python3 -m venv .venv
    .venv/bin/pip install -q -r requirements.txt
    until [ -e '$1' ]; do sleep 1; done
    .venv/bin/python -m pytest -q -p no:cacheprovider -m 'not end_to_end'
  " >"$FAST_TIER_LOG" 2>&1 &
  FAST_TIER=$!
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

# Debian's Prometheus tools for the tests: promtool checks what the deploy writes for Prometheus,
# and tests/serving runs a real Prometheus against a real vLLM. Unpacked from Debian's package into
# the lab's cache (readable by every user: CI's fast tier runs them as an ordinary user too), never
# installed, so no service starts on this machine. One on PATH is used instead.
PROMETHEUS_CACHE=${SPARKLAB_CACHE:-/var/cache/sparklab}
install_prometheus_tools() {
  if command -v promtool >/dev/null && command -v prometheus >/dev/null; then
    return
  fi
  if ls "$PROMETHEUS_CACHE"/prometheus-*/bin/promtool >/dev/null 2>&1; then
    return
  fi
  echo "--> Unpacking Debian's prometheus (promtool and prometheus, for the tests) into $PROMETHEUS_CACHE"
  local work deb version
  work=$(mktemp -d)
  (cd "$work" && { apt-get download prometheus >/dev/null 2>&1 || { apt-get update -qq && apt-get download prometheus >/dev/null; }; })
  deb=$(ls "$work"/prometheus_*.deb)
  version=$(dpkg-deb -f "$deb" Version)
  dpkg-deb -x "$deb" "$work/root"
  mkdir -p "$PROMETHEUS_CACHE/prometheus-$version/bin"
  install -m 755 "$work/root/usr/bin/prometheus" "$work/root/usr/bin/promtool" "$PROMETHEUS_CACHE/prometheus-$version/bin/"
  rm -rf "$work"
}

# Debian's amtool checks what the deploy writes for Alertmanager, and its daemon takes the silences
# of planned work in tests/programs: unpacked from prometheus-alertmanager into the same cache, as
# promtool is (tests/observability.py finds them there), never installed or started as a service.
# The daemon reads its templates at the path Debian's build names, where they are put.
ALERTMANAGER_TEMPLATES=/usr/share/prometheus/alertmanager
install_alertmanager_tools() {
  if command -v prometheus-alertmanager >/dev/null; then
    return
  fi
  if [ -e "$ALERTMANAGER_TEMPLATES/email.tmpl" ] && ls "$PROMETHEUS_CACHE"/prometheus-alertmanager-*/bin/prometheus-alertmanager >/dev/null 2>&1; then
    return
  fi
  echo "--> Unpacking Debian's prometheus-alertmanager (amtool and the daemon, for the tests) into $PROMETHEUS_CACHE"
  local work deb version
  work=$(mktemp -d)
  (cd "$work" && { apt-get download prometheus-alertmanager >/dev/null 2>&1 || { apt-get update -qq && apt-get download prometheus-alertmanager >/dev/null; }; })
  deb=$(ls "$work"/prometheus-alertmanager_*.deb)
  version=$(dpkg-deb -f "$deb" Version)
  dpkg-deb -x "$deb" "$work/root"
  mkdir -p "$PROMETHEUS_CACHE/prometheus-alertmanager-$version/bin"
  install -m 755 "$work/root/usr/bin/amtool" "$work/root/usr/bin/prometheus-alertmanager" "$PROMETHEUS_CACHE/prometheus-alertmanager-$version/bin/"
  mkdir -p "$ALERTMANAGER_TEMPLATES"
  cp -n "$work/root$ALERTMANAGER_TEMPLATES"/*.tmpl "$ALERTMANAGER_TEMPLATES/"
  rm -rf "$work"
}
