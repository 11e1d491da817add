"""zoo.registry: experience schema, canonical encoding, Merkle commitments, IPFS, chain client, sync."""
