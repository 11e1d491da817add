"""Placeholder CLI, replaced below."""
def main() -> None:
    print("zoo-node")
