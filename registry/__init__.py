"""zoo.registry: experience schema, canonical encoding, Merkle commitments, IPFS, chain clients, sync,
usage reports, spend authorizations. Imports zoo.contracts only: every other layer builds on it."""
