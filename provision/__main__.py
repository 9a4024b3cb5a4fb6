from provision.cli.main import main

main()
