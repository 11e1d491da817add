"""zoo.devnet: a local chain (anvil) and IPFS daemon with deployed contracts, for running and testing.
Imports zoo.registry and zoo.contracts; the node and the tests drive it."""
