"""``python -m hybridrank.cli [overrides]``: ``hybridrank-train`` (e.g. under torchrun)."""

from hybridrank.cli.train import train_main

if __name__ == "__main__":
    train_main()
