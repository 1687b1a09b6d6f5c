#!/bin/sh
# The lab has no systemd: a package's maintainer scripts start no service (as in a container
# image); the units the deploy enables are started by its systemctl (lab/factory/usr/local/sbin/systemctl).
exit 101
