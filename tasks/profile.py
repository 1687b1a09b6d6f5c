"""Switch the serving profile of every node:

    pyinfra inventory.py tasks/profile.py --data profile=fast
    pyinfra --dry inventory.py tasks/profile.py --data profile=long-c4   # shows the stack diffs only

The profile's runtime image is made present on every node first (long-c4 has its own); then the
stacks change in the serving order, restarting every worker, then the head, only when something
changed; then every node is read back. The site's [settings] profile stays the default of every run.
"""

from pyinfra import local

local.include("tasks/runtime.py")
local.include("tasks/serving.py")
local.include("tasks/verify.py")
