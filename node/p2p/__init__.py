"""The node network: a libp2p host per node, gossip of library versions and capabilities, content from
peers, the peer book (see component.py for how the pieces fit). Below the front doors: imports zoo.node's
components, config and logs, inference and registry."""
