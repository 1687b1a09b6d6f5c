# Sourced by scripts/test: the coding agents the end-to-end tests run against the lab, Claude Code
# and the Codex CLI from the npm registry at pinned versions, installed once into a cache
# (the default of lab/config.py AGENTS_DIR). Exports SPARKLAB_AGENTS.
set -euo pipefail
CLAUDE_CODE_VERSION=2.1.197
CODEX_VERSION=0.171.0
AGENTS_DIR=${SPARKLAB_CACHE:-/var/cache/sparklab}/agents-claude-code-$CLAUDE_CODE_VERSION-codex-$CODEX_VERSION

install_agents() {
  if [ ! -f "$AGENTS_DIR/.complete" ]; then
    if ! command -v npm >/dev/null; then
      echo "--> Installing npm"
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null
    fi
    echo "--> Installing Claude Code $CLAUDE_CODE_VERSION and the Codex CLI $CODEX_VERSION into $AGENTS_DIR (once)"
    rm -rf "$AGENTS_DIR"
    npm install --prefix "$AGENTS_DIR" --no-audit --no-fund --loglevel=error \
      "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" "@openai/codex@$CODEX_VERSION"
    local home
    home=$(mktemp -d)  # their first run writes into HOME
    HOME=$home "$AGENTS_DIR/node_modules/.bin/claude" --version | grep -q "^$CLAUDE_CODE_VERSION "
    HOME=$home "$AGENTS_DIR/node_modules/.bin/codex" --version 2>/dev/null | grep -q " $CODEX_VERSION$"
    rm -rf "$home"
    touch "$AGENTS_DIR/.complete"
  fi
  export SPARKLAB_AGENTS="$AGENTS_DIR"
}
