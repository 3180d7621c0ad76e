from whaleflux.cli import main

main()
