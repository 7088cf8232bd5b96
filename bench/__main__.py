"""python -m bench: see bench/cli.py. An installed plug-in that breaks its contract is refused here, in one line
naming its package and with exit 2 as bad input is: the registries find the plug-ins as the config is built, on
import (bench/plugins.py)."""

import sys

from bench.errors import PluginError

try:
    from bench.cli import main
except PluginError as e:
    print(f"bench: error: {e}", file=sys.stderr)
    sys.exit(2)

if __name__ == "__main__":
    main()
