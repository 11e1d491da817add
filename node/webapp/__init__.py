"""The governance web app the node serves on its HTTP port (`/`, beside `/v1`): KEEPER holders, contributors
and operators in a browser, every transaction signed by the user's own wallet (EIP-1193), never by the node.

`site.py` serves the built pages and the read-only data they show (`/app/*`): the chain through a JSON-RPC
proxy that lets reads alone through (`chain_proxy.py`), library bytes by CID (checked against the CID), and
this node's status. The pages themselves (`src/`, bundled with viem by esbuild at setup into `dist/`) do the
chain work and recompute a proposal's Merkle root from its bytes in the browser.
"""
