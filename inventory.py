"""The Sparks, from the site file (`site.toml`, or the file named by $DUAL_SPARK_SITE): the head
and its workers, in rank order.

The site file and any `--data` override are validated here, before pyinfra connects to a host.
"""

import sys

from pyinfra.api.exceptions import InventoryError

from site_config import SiteError, cli_data_overrides, inventory_groups, load_site

try:
    _groups = inventory_groups(load_site(overrides=cli_data_overrides(sys.argv)))
except SiteError as error:
    raise InventoryError(str(error)) from None

head = _groups["head"]
worker = _groups["worker"]
