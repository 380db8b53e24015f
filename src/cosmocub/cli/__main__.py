from cosmocub.cli import main

main()
