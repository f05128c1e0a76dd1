"""A plugin module that raises KeyboardInterrupt at import, with no Ctrl-C pressed."""

raise KeyboardInterrupt("plugin raised KeyboardInterrupt itself")
