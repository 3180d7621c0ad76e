"""The `whaleflux` commands, one module per group; whaleflux/cli.py registers them on the app.

Start-up time is part of the interface: --help and read commands import only typer, rich and (to make a request)
httpx. Anything heavier (nats-py, redis, the event models, pydantic models of a service) is imported inside the
command that needs it. bench/cli_startup.py measures it; tests/test_cli_startup.py guards it.
"""
