"""`python -m whaleflux.console`: run the console in the foreground."""

from .app import main

main()
