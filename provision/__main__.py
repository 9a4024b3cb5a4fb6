from provision.cli import main

main()
