"""`python -m trajectory_transformer.evaluate ...` is the same as `tt-eval ...`."""

from trajectory_transformer.cli.evaluate import main

if __name__ == "__main__":
    main()
