"""zoo.node.jobs: learning jobs: their persistent store (store.py), the daemon's runner that takes them one
at a time (runner.py) and the same run in the foreground without a daemon (foreground.py). Below the front
doors: it may import zoo.node's config, metrics, logs and components, and zoo.trainer and below.
"""
