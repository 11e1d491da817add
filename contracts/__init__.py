"""zoo.contracts: the Solidity sources (src/) and the solcjs build that turns them into cached artifacts.
The bottom layer: imports nothing else of zoo."""
