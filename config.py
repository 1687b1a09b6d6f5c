"""pyinfra settings for every run from this directory."""

from pyinfra import config

config.REQUIRE_PYINFRA_VERSION = "~=3.10.0"

# Show the unified diff of every file change before anything runs (and with --dry).
config.DIFF = True
