"""A plugin module that fails at import, as a plugin with a missing dependency does."""

raise RuntimeError("tiny plugin exploded at import")
