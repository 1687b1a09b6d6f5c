"""pyinfra settings for every run from this directory, and a first look at the command line's
`--data` pairs: pyinfra reads them after this file, and a malformed one (no `=`, nested past
any setting) stopped it with a traceback."""

import sys

from pyinfra import config
from pyinfra.api.exceptions import PyinfraError

from site_config import SiteError, cli_data_overrides

try:
    cli_data_overrides(sys.argv)
except SiteError as error:
    raise PyinfraError(f"{error} No host was contacted.") from None

config.REQUIRE_PYINFRA_VERSION = "~=3.10.0"

# Show the unified diff of every file change before anything runs (and with --dry).
config.DIFF = True
