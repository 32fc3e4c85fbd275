from envbuild.cli.main import main

main()
