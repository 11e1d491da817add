"""zoo.node.cli: the `zoo-node` command line, one module a command group (main assembles them; context
holds what they share, options their common options and console the rich consoles). On top of the node: it
may import anything in zoo.node and below; nothing in the daemon imports it."""
