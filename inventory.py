"""The two Sparks, from the site file (`site.toml`, or the file named by $DUAL_SPARK_SITE).

The site file and any `--data` override are validated here, before pyinfra connects to a host.
"""

import sys

from pyinfra.api.exceptions import InventoryError

from site_config import SiteError, cli_data_overrides, load_site

try:
    _groups = load_site(overrides=cli_data_overrides(sys.argv)).inventory_groups()
except SiteError as error:
    raise InventoryError(str(error)) from None

head = _groups["head"]
worker = _groups["worker"]
