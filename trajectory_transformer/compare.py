"""`python -m trajectory_transformer.compare ...` is the same as `tt-compare ...`."""

from trajectory_transformer.cli.compare import main

if __name__ == "__main__":
    main()
