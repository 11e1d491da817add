"""zoo.devnet: a local chain (anvil) and IPFS daemon with deployed contracts, for running and testing."""
