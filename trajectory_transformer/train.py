"""`python -m trajectory_transformer.train ...` is the same as `tt-train ...`."""

from trajectory_transformer.cli.train import main

if __name__ == "__main__":
    main()
