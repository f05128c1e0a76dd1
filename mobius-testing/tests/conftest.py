"""mobius-testing tests: the plugin is exercised on throwaway projects with pytester."""

pytest_plugins = ["pytester"]
