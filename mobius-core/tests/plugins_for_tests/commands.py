"""A plugin that adds a CLI command (``mobius hello``) and builds nothing."""

from mobius import hookimpl


@hookimpl
def mobius_add_commands(app):
    @app.command("hello")
    def hello(name: str = "world") -> None:
        """Say hello (test plugin)."""
        import typer

        typer.echo(f"hello {name}")
