"""A plugin module that calls sys.exit() at import (as a badly written script-plugin does)."""

import sys

sys.exit(3)
