"""A plugin module that raises a BaseException subclass of its own at import."""


class PluginAbort(BaseException):
    pass


raise PluginAbort("plugin aborted at import")
