"""`python -m zoo.node.cli …` runs the `zoo-node` command line."""

from zoo.node.cli.main import main

main()
