"""Plugin modules used only by mobius-core's tests (loaded through fake entry points)."""
