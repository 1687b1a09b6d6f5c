"""pyinfra's own data for every host. The site's settings are not host data: they reach the code
once, parsed and typed, as the cluster (site_config.py; each declared, with its default, in site_schema.py)."""

# Every operation runs as root through sudo; the deploy user itself is a normal user.
_sudo = True
